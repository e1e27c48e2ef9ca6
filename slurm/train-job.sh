# The body of the training jobs (sourced by train.sbatch and translate.sbatch
# after their defaults): run experiments.train on every rank of the job,
# requeue when it stopped at a checkpoint before the time limit.

source slurm/launch.sh || exit 2

RESULTS_DIR=${RESULTS_DIR:-results/slurm}
mkdir -p "$RESULTS_DIR"
run_file=$RESULTS_DIR/${ALGO:-wagma}_${SLURM_JOB_ID}.h5
checkpoints=$RESULTS_DIR/checkpoints/$SLURM_JOB_ID

train=(-m experiments.train --algo "${ALGO:-wagma}" --model "${MODEL:-resnet50}" --dataset "${DATASET:-synthetic}"
       --epochs "${EPOCHS:-90}" --batch-size "${BATCH_SIZE:-128}" --imbalance "${IMBALANCE:-none}"
       --compute "${COMPUTE:-real}" --seed "${SEED:-0}" --device "$(default_device)"
       --out "$run_file" --no-progress)
# ensemble_sync goes on by itself when ranks are late or dead, and its ranks
# are never at one step together, so it has no checkpoints to requeue from.
[[ ${ALGO:-wagma} != ensemble_sync ]] && train+=(--checkpoint-dir "$checkpoints" --resume)
[[ -n ${DATA_DIR:-} ]] && train+=(--data-dir "$DATA_DIR")
# shellcheck disable=SC2206
train+=(${TRAIN_ARGS:-})

echo "wagma-train: job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}) on $SLURM_NNODES nodes, $SLURM_NTASKS ranks: ${train[*]}"
launch "${train[@]}"
status=$?
# Stopped at a checkpoint: every rank exits 75, but srun's --kill-on-bad-exit
# may terminate the last ranks once the first has exited 75 and then report
# another status; the run file's status, written by rank 0 before it exits,
# says it either way.
written=$("$PYTHON" -c 'import sys, h5py; from wagma.results import partial_path
with h5py.File(partial_path(sys.argv[1]), "r") as f: print(f.attrs["status"])' "$run_file" 2>/dev/null)
if [[ $status -eq 75 || $written == stopped ]]; then
    echo "wagma-train: stopped at a checkpoint before the time limit; requeueing job $SLURM_JOB_ID"
    scontrol requeue "$SLURM_JOB_ID"
    return 75
fi
# A finished run is its file under the final name.
wrote "$run_file" "$status"
