# Sourced by the sbatch scripts: how ranks are started and which device they use.
#
#   launch ARGS...    start $RANKS (default $SLURM_NTASKS) ranks of "$PYTHON ARGS..."
#                     (with EXIT_LEDGER=DIR each through record-exit.sh, which
#                     writes how the rank ended to DIR/rank-R) with
#                     LAUNCHER=srun (default): srun --mpi=$SRUN_MPI, by default the
#                       plugin of the MPI library mpi4py loads (pmi2 for MPICH,
#                       pmix for Open MPI; Cray MPICH: set SRUN_MPI=cray_shasta)
#                     or LAUNCHER=mpiexec: $MPIEXEC, else the mpiexec next to
#                       $PYTHON, else on PATH, with the flags its library needs,
#                       and with FAULT_TOLERANT=1 Open MPI's ULFM (--with-ft ulfm:
#                       ensemble_sync's survivors go on when a rank dies; srun's
#                       --kill-on-bad-exit ends the whole step instead)
#                     (both through experiments.mpirun)
#   default_device    cuda when the job was given GPUs, else cpu (DEVICE overrides)
#   wrote FILE STATUS the job's exit status from the launcher's STATUS: 1, with a
#                     message, when STATUS is 0 but the ranks left no FILE (srun
#                     exits 0 when its step fails to launch: "task 0 launch failed")
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
    local ranks=${RANKS:-$SLURM_NTASKS} rank=("$PYTHON")
    [[ -n ${EXIT_LEDGER:-} ]] && rank=(bash slurm/record-exit.sh "$EXIT_LEDGER" "$PYTHON")
    case ${LAUNCHER:-srun} in
        srun)
            local plugin=${SRUN_MPI:-}
            if [[ -z $plugin ]]; then
                plugin=$("$PYTHON" -m experiments.mpirun --srun-mpi) || return 2
            fi
            srun --mpi="$plugin" --kill-on-bad-exit=1 -n "$ranks" "${rank[@]}" "$@" ;;
        mpiexec)
            # shellcheck disable=SC2046
            "$PYTHON" -m experiments.mpirun $([[ ${FAULT_TOLERANT:-0} == 1 ]] && echo --fault-tolerant) \
                -n "$ranks" -- "${rank[@]}" "$@" ;;
        *)
            echo "launch: LAUNCHER must be srun or mpiexec, got '$LAUNCHER'" >&2
            return 2 ;;
    esac
}

wrote() {
    if [[ $2 -eq 0 && ! -f $1 ]]; then
        echo "launch: the ranks ended without writing $1; they did not start or did not finish (see above)" >&2
        return 1
    fi
    return "$2"
}
