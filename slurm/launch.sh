# Sourced by the sbatch scripts: how ranks are started and which device they use.
#
#   launch ARGS...    start $SLURM_NTASKS ranks of "$PYTHON ARGS..." with
#                     LAUNCHER=srun (default: srun --mpi=$SRUN_MPI, pmi2 unless set)
#                     or LAUNCHER=mpiexec (the mpiexec next to $PYTHON, else on PATH)
#   default_device    cuda when the job was given GPUs, else cpu (DEVICE overrides)
#
# GPUs: with --gpus-per-task=1 Slurm gives each rank one device in
# CUDA_VISIBLE_DEVICES; with GPUs shared per node each rank takes
# local rank mod GPU count (experiments.train does that), so one rank per GPU
# either way.

PYTHON=${PYTHON:-.venv/bin/python}

default_device() {
    if [[ -n ${DEVICE:-} ]]; then
        echo "$DEVICE"
    elif [[ -n ${SLURM_GPUS_ON_NODE:-} && ${SLURM_GPUS_ON_NODE} != 0 ]]; then
        echo cuda
    else
        echo cpu
    fi
}

launch() {
    case ${LAUNCHER:-srun} in
        srun)
            srun --mpi="${SRUN_MPI:-pmi2}" --kill-on-bad-exit=1 "$PYTHON" "$@" ;;
        mpiexec)
            local mpiexec
            mpiexec=$(dirname "$PYTHON")/mpiexec
            [[ -x $mpiexec ]] || mpiexec=mpiexec
            "$mpiexec" -n "$SLURM_NTASKS" "$PYTHON" "$@" ;;
        *)
            echo "launch: LAUNCHER must be srun or mpiexec, got '$LAUNCHER'" >&2
            return 2 ;;
    esac
}
