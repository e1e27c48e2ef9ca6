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
# time limit is for the rank, not for this script); should this script be
# killed, COMMAND is killed with it (setpriv --pdeathsig), never left running.

ledger=$1
shift
rank=${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-${SLURM_PROCID:?record-exit.sh: no rank in the environment}}}
if setpriv --help 2>/dev/null | grep -q -- --pdeathsig; then
    setpriv --pdeathsig KILL -- "$@" &
else
    "$@" &
fi
child=$!
for sig in TERM USR1 INT; do
    # shellcheck disable=SC2064
    trap "kill -$sig $child 2>/dev/null" "$sig"
done
# wait returns early (128+N) when a forwarded signal arrives; the child is
# reaped, its status known, once kill -0 no longer finds it.
while kill -0 "$child" 2>/dev/null; do
    wait "$child"
    status=$?
done
mkdir -p "$ledger"
echo "$status $(date +%s.%N)" > "$ledger/rank-$rank"
exit "$status"
