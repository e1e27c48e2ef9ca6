# The body of the training jobs (sourced by train.sbatch and translate.sbatch
# after their defaults): run experiments.train on every rank of the job,
# requeue when it stopped at a checkpoint before the time limit, and, when
# ranks died and the launcher ended the job, relaunch it inside the
# allocation on the ranks left, from the last checkpoint (at most
# MAX_RELAUNCHES times, default 3).

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

# Ranks: the job's tasks, or, resuming from a checkpoint taken after ranks
# died, that checkpoint's members.
RANKS=$SLURM_NTASKS
[[ ${ALGO:-wagma} != ensemble_sync ]] && RANKS=$("$PYTHON" -m experiments.checkpoint ranks "$checkpoints" --default "$SLURM_NTASKS")
export RANKS
relaunches=0
while true; do
    say "job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}, relaunch $relaunches) on $SLURM_NNODES nodes, $RANKS ranks: ${train[*]}"
    ledger=$RESULTS_DIR/exits/$SLURM_JOB_ID.$relaunches
    rm -rf "$ledger"
    EXIT_LEDGER=$ledger launch "${train[@]}"
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
    if [[ ${ALGO:-wagma} == ensemble_sync || ${#dead[@]} -eq 0 || $relaunches -ge ${MAX_RELAUNCHES:-3} ]]; then
        say "the ranks failed (status $status${dead:+; died: ${dead[*]}}); not relaunched"
        break
    fi
    # Relaunch on the ranks left, from the last checkpoint: the failed
    # segment's file is kept beside the run file, and the checkpoint drops
    # the dead ranks (their data shards go to the others).
    relaunches=$((relaunches + 1))
    cp "$(dirname "$run_file")/$(basename "$run_file" .h5).partial.h5" "${run_file%.h5}.failed-$relaunches.h5"
    RANKS=$("$PYTHON" -m experiments.checkpoint without "$checkpoints" --of "$RANKS" --died-at "$died_at" "${dead[@]}") || break
    say "ranks ${dead[*]} died (at $(date -d "@$died_at" +%T.%3N)); relaunching on the $RANKS ranks left from the last checkpoint (relaunch $relaunches)"
done
rmdir "$RESULTS_DIR/exits" 2>/dev/null
# A finished run is its file under the final name.
wrote "$run_file" "$status"
