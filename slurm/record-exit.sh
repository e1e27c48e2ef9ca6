#!/bin/bash
# record-exit.sh DIR COMMAND...: run one rank's COMMAND and write how it ended
# to DIR/rank-R ("STATUS SECONDS": the exit status as bash gives it, 128+N for
# signal N, and when, in seconds since the epoch), so that after a failed
# launch train-job.sh can tell the ranks that died (killed by a signal: lost
# hardware, the OOM killer, a segfault) from those the launcher ended after
# them (killed with this script, which records nothing) and from a program
# error (a status of its own: not relaunched, it would fail again).
#
# SIGTERM, SIGUSR1 and SIGINT go on to COMMAND (Slurm's warning before the
# time limit is for the rank, not for this script), except a SIGTERM that
# comes after another rank died (its record in DIR says a signal killed it):
# that is srun ending the step, and a rank blocked in MPI on the dead one
# would hold the step for Slurm's KillWait (30 s by default) before the
# SIGKILL, so COMMAND is killed at once (every row it measured is in its
# log already).  Should this script be killed, COMMAND is killed with it
# (setpriv --pdeathsig), never left running.

ledger=$1
shift
rank=${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-${SLURM_PROCID:?record-exit.sh: no rank in the environment}}}
if setpriv --help 2>/dev/null | grep -q -- --pdeathsig; then
    setpriv --pdeathsig KILL -- "$@" &
else
    "$@" &
fi
child=$!

a_rank_died() {
    local record code _
    for record in "$ledger"/rank-*; do
        [[ -f $record ]] || continue
        read -r code _ < "$record"
        (( code > 128 )) && return 0
    done
    return 1
}

on_term() {
    interrupted=1
    if a_rank_died; then
        ended_with_the_step=1
        kill -KILL "$child" 2>/dev/null
    else
        kill -TERM "$child" 2>/dev/null
    fi
}

trap on_term TERM
for sig in USR1 INT; do
    # shellcheck disable=SC2064
    trap "interrupted=1; kill -$sig $child 2>/dev/null" "$sig"
done
# A trapped signal makes wait return early (128+N) whether or not the child
# has ended (bash may have reaped it already: kill -0 cannot tell); wait
# again until a wait returns uninterrupted, with the child's own status.
while true; do
    interrupted=
    wait "$child"
    status=$?
    [[ -z $interrupted ]] && break
done
# A rank killed here because the step ended is not a death: no record.
if [[ -z ${ended_with_the_step:-} ]]; then
    mkdir -p "$ledger"
    echo "$status $(date +%s.%N)" > "$ledger/rank-$rank"
fi
# End the way the rank ended: killed by the same signal, for the launcher
# (PRRTE under --with-ft ulfm takes a killed process as a death the others
# survive, but waits for ever after a process that exits with a non-zero
# status).
if (( status > 128 )); then
    trap - TERM USR1 INT
    kill -s $((status - 128)) $$
fi
exit "$status"
