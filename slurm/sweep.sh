#!/usr/bin/env bash
# Submit a throughput sweep: every algorithm at a range of node counts, one
# sbatch job each (one rank per node and GPU), like WAGMA-SGD's Figures 4, 7, 10.
#
#   slurm/sweep.sh FIGURE [NODES] [ALGOS] -- [sbatch options...]
#   slurm/sweep.sh 4 4,8,16,32,64 all -- -A ACCOUNT -p PARTITION --gpus-per-task=1
#
# FIGURE   4:  ResNet-50, synthetic ImageNet batches of 128, 2 random ranks x 320 ms
#          7:  transformer-base on the translation task (variable sentence lengths), tau = 8
#          10: emulated RL episodes: compute times from a lognormal with median 2 s,
#              clipped to 1.7-43.5 s (WAGMA's navigation runs), full-size MLP buffers
# NODES    comma-separated node counts (default 4,8,16,32,64)
# ALGOS    comma-separated algorithms, or all (default: the paper's seven); the 2026
#          baselines: diloco,streaming_diloco (with TRAIN_ARGS="--period 10", and
#          "--compression int8" or WAGMA-SGD's "--outer-lr 0.7 --outer-momentum 0.9")
# STEPS           steps per run (default 200; from the environment)
# RANKS_PER_NODE  ranks per node (default 1: one per node and GPU)
# Each run writes results/slurm/ALGO_JOBID.h5; compare them with
#   python -m wagma.analysis results/slurm --plot figures/
# Run it from the repository root on the login node.
set -euo pipefail

figure=${1:?usage: slurm/sweep.sh FIGURE [NODES] [ALGOS] -- [sbatch options...]}
shift
nodes=4,8,16,32,64
algos=allreduce_sgd,local_sgd,wagma,dpsgd,adpsgd,sgp,eager_sgd
if [[ $# -gt 0 && $1 != -- ]]; then nodes=$1; shift; fi
if [[ $# -gt 0 && $1 != -- ]]; then [[ $1 != all ]] && algos=$1; shift; fi
[[ $# -gt 0 && $1 == -- ]] && shift
steps=${STEPS:-200}

case $figure in
    4)  script=slurm/train.sbatch
        export MODEL=resnet50 DATASET=synthetic BATCH_SIZE=128 IMBALANCE=random:k=2,ms=320 COMPUTE=real ;;
    7)  script=slurm/translate.sbatch
        export IMBALANCE=none COMPUTE=real ;;
    10) script=slurm/train.sbatch
        export MODEL=mlp DATASET=synthetic BATCH_SIZE=128 COMPUTE=emulate \
               IMBALANCE=lognormal:median_ms=2000,sigma=1,min_ms=1700,max_ms=43500 ;;
    *)  echo "slurm/sweep.sh: FIGURE must be 4, 7 or 10, got '$figure'" >&2; exit 2 ;;
esac

for n in ${nodes//,/ }; do
    for algo in ${algos//,/ }; do
        ALGO=$algo EPOCHS=1000 TRAIN_ARGS="--max-steps $steps --eval-every 0 ${TRAIN_ARGS:-}" \
            sbatch --parsable --nodes="$n" --ntasks-per-node="${RANKS_PER_NODE:-1}" --job-name="fig$figure-$algo-n$n" \
            --export=ALL "$@" "$script" | sed "s/^/fig$figure $algo n=$n: job /"
    done
done
