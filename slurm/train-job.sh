# The body of the training jobs (sourced by train.sbatch and translate.sbatch
# after their defaults): run experiments.train on every rank of the job,
# requeue when it stopped at a checkpoint before the time limit, and, when
# ranks died and the launcher ended the job, relaunch it inside the
# allocation on the ranks left, from the last checkpoint (at most
# MAX_RELAUNCHES times, default 3).
#
# SPARES=K: the job's last K tasks are spares that replace ranks that die.
# Where the launcher survives a death (LAUNCHER=mpiexec FAULT_TOLERANT=1,
# Open MPI's ULFM) they wait inside the running job and join it
# (experiments.train --spares K); srun ends the step instead, and no process
# can join a step that ended, so there (and where the fault-tolerant launcher
# still ended the job) the job is requeued when ranks die (at most
# MAX_REQUEUES times, default 3): Slurm starts it again, on nodes that are
# up, from the last checkpoint.

source slurm/launch.sh || exit 2

say() { echo "wagma-train $(date +%T.%3N): $*"; }

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

SPARES=${SPARES:-0}
if ! [[ $SPARES =~ ^(0|[1-9][0-9]*)$ ]] || (( SPARES >= SLURM_NTASKS )); then
    echo "train-job.sh: SPARES must be a whole number of spare tasks below the job's $SLURM_NTASKS, got '$SPARES'" >&2
    return 2
fi
live_spares=0
if (( SPARES > 0 )); then
    if [[ ${ALGO:-wagma} == ensemble_sync && ! ( ${LAUNCHER:-srun} == mpiexec && ${FAULT_TOLERANT:-0} == 1 ) ]]; then
        echo "train-job.sh: SPARES=$SPARES with ALGO=ensemble_sync needs LAUNCHER=mpiexec FAULT_TOLERANT=1: its" \
             "spares join a living job, and it has no checkpoint to requeue from (${LAUNCHER:-srun} without MPI" \
             "fault tolerance ends the job when a rank dies); set them, or SPARES=0" >&2
        return 2
    fi
    if [[ ${LAUNCHER:-srun} == mpiexec && ${FAULT_TOLERANT:-0} == 1 ]]; then
        live_spares=$SPARES
        train+=(--spares "$SPARES")
    else
        say "SPARES=$SPARES: ${LAUNCHER:-srun} without MPI fault tolerance ends the job's ranks when one dies, so no" \
            "spare can join them; the $SPARES tasks stay idle, and when ranks die the job is requeued to go on from its" \
            "last checkpoint"
    fi
fi

# Ranks: the job's tasks, or, resuming from a checkpoint taken after ranks
# died, that checkpoint's members.
# Spares are started with the ranks, on top of them.
RANKS=$((SLURM_NTASKS - SPARES))
[[ ${ALGO:-wagma} != ensemble_sync ]] && RANKS=$("$PYTHON" -m experiments.checkpoint ranks "$checkpoints" --default "$RANKS")
relaunches=0
# MPICH names a step's shared-memory segments (/dev/shm/mpich_shm_*) after the
# job and step, and killed ranks leave theirs behind: a requeued job, whose
# steps are numbered from 0 again, would attach to them and fail in MPI_Init
# ("Message truncated").  On every node: those of this user made since the
# launch (epoch seconds $1) that no process maps any more.
remove_leftover_segments() {
    [[ ${LAUNCHER:-srun} == srun ]] || return 0
    # shellcheck disable=SC2016
    timeout 120 srun --ntasks-per-node=1 -n "$SLURM_NNODES" bash -c '
        for f in $(find /dev/shm -maxdepth 1 -user "$(id -u)" -name "mpich_shm_*" -newermt "@$1"); do
            grep -qsF "$f" /proc/[0-9]*/maps || rm -f "$f"
        done' bash "$1"
}
# The next free name for a failed segment's run file (relaunches and requeues number them in turn).
failed_segment() {
    local k=1
    while [[ -e ${run_file%.h5}.failed-$k.h5 ]]; do k=$((k + 1)); done
    echo "${run_file%.h5}.failed-$k.h5"
}
while true; do
    spares_said=$( (( live_spares )) && echo " and $live_spares spares")
    say "job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}, relaunch $relaunches) on $SLURM_NNODES nodes, $RANKS ranks$spares_said: ${train[*]}"
    ledger=$RESULTS_DIR/exits/$SLURM_JOB_ID.$relaunches
    rm -rf "$ledger"
    launched=$(date +%s)
    EXIT_LEDGER=$ledger RANKS=$((RANKS + live_spares)) launch "${train[@]}"
    status=$?
    # Stopped at a checkpoint: every rank exits 75, but srun's --kill-on-bad-exit
    # may terminate the last ranks once the first has exited 75 and then report
    # another status; the run file's status, written by rank 0 before it exits,
    # says it either way.
    written=$("$PYTHON" -c 'import sys, h5py; from wagma.results import partial_path
with h5py.File(partial_path(sys.argv[1]), "r") as f: print(f.attrs["status"])' "$run_file" 2>/dev/null)
    if [[ $status -eq 75 || $written == stopped ]]; then
        rm -rf "$ledger"
        say "stopped at a checkpoint before the time limit; requeueing job $SLURM_JOB_ID"
        remove_leftover_segments "$launched"  # srun may have killed the last ranks as the first exited
        scontrol requeue "$SLURM_JOB_ID"
        return 75
    fi
    [[ $status -eq 0 ]] && { rm -rf "$ledger"; break; }
    say "the launch ended with status $status"
    # A rank failed and the launcher ended the others (no MPI fault tolerance,
    # or one it could not survive): the run file gets every rank's rows and
    # the mark "failed: a rank died".
    "$PYTHON" -m wagma.results complete "$run_file"
    # The ranks that died are those a signal killed (record-exit.sh); a rank
    # that exited with an error of its own is a program error: not relaunched.
    dead=() deaths=()
    for record in "$ledger"/rank-*; do
        [[ -f $record ]] || continue
        read -r code when < "$record"
        if (( code > 128 )); then
            dead+=("${record##*/rank-}")
            deaths+=("$when")
        fi
    done
    died_at=$(printf '%s\n' "${deaths[@]}" | sort -g | head -n 1)
    rm -rf "$ledger"
    if [[ ${ALGO:-wagma} == ensemble_sync || ${#dead[@]} -eq 0 ]]; then
        say "the ranks failed (status $status${dead:+; died: ${dead[*]}}); not relaunched"
        break
    fi
    if (( SPARES > 0 )); then
        # Replaced by a requeue (srun, or a death the fault-tolerant launcher
        # did not survive): the same job, spares included, from the last
        # checkpoint (on its members: all the ranks under srun, which never
        # shrinks), the failed segment's file kept beside the run file.
        requeues=$(cat "$checkpoints/requeues" 2>/dev/null || echo 0)
        if (( requeues >= ${MAX_REQUEUES:-3} )); then
            say "ranks ${dead[*]} died; not requeued: the job was requeued for dead ranks ${requeues} times (MAX_REQUEUES)"
            break
        fi
        mkdir -p "$checkpoints" && echo $((requeues + 1)) > "$checkpoints/requeues"
        remove_leftover_segments "$launched"
        cp "$(dirname "$run_file")/$(basename "$run_file" .h5).partial.h5" "$(failed_segment)"
        say "ranks ${dead[*]} died (at $(date -d "@$died_at" +%T.%3N)); requeueing job $SLURM_JOB_ID to go on from" \
            "the last checkpoint (requeue $((requeues + 1)) for dead ranks)"
        scontrol requeue "$SLURM_JOB_ID" && return 75
        say "scontrol requeue failed; the job ends here"
        break
    fi
    if (( relaunches >= ${MAX_RELAUNCHES:-3} )); then
        say "ranks ${dead[*]} died; not relaunched: the job was relaunched $relaunches times (MAX_RELAUNCHES)"
        break
    fi
    # Relaunch on the ranks left, from the last checkpoint: the failed
    # segment's file is kept beside the run file, and the checkpoint drops
    # the dead ranks (their data shards go to the others).
    relaunches=$((relaunches + 1))
    cp "$(dirname "$run_file")/$(basename "$run_file" .h5).partial.h5" "$(failed_segment)"
    RANKS=$("$PYTHON" -m experiments.checkpoint without "$checkpoints" --of "$RANKS" --died-at "$died_at" "${dead[@]}") || break
    say "ranks ${dead[*]} died (at $(date -d "@$died_at" +%T.%3N)); relaunching on the $RANKS ranks left from the last checkpoint (relaunch $relaunches)"
done
rmdir "$RESULTS_DIR/exits" 2>/dev/null
# A finished run is its file under the final name.
wrote "$run_file" "$status"
