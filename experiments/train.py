"""Distributed training with injected load imbalance: ``mpiexec -n P python -m experiments.train --algo NAME``.

Every rank trains its replica on its own shard with the chosen algorithm
(``wagma.algorithms``), sleeping as the imbalance model says, and records
every step; rank 0 writes the run file (``wagma.results``) as the run goes
and reports its progress (a bar on a terminal, log lines elsewhere).  ``--help`` lists the options; docs/training.md
explains the set-up and the output.

Exit status: 0 when the run completed, 2 for a bad command line (reported
by rank 0 before any training, the same verdict on every rank), 75
(``EX_TEMPFAIL``) when a SIGTERM or SIGUSR1 stopped it at a checkpoint to
be resumed with ``--resume``; an error on any rank during training prints
``[rank R]`` and its traceback and aborts the job.
"""

import argparse
import sys
import traceback

from .options import UsageError, build_parser

__all__ = ["EXIT_STOPPED", "main"]

EXIT_USAGE, EXIT_STOPPED = 2, 75


def _world():
    from mpi4py import MPI

    return MPI.COMM_WORLD


class _RankZeroParser(argparse.ArgumentParser):
    """argparse, but only rank 0 prints the usage error (P copies help no one).

    Parsing imports neither torch nor MPI, so ``--help`` is quick; MPI is
    imported only to learn the rank when there is an error to print."""

    def error(self, message):
        if _world().Get_rank() == 0:
            self.print_usage(sys.stderr)
            print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(EXIT_USAGE)


def main(argv=None) -> int:
    args = build_parser(_RankZeroParser).parse_args(argv)
    from collectives import Communicator  # after parsing: --help imports neither MPI nor torch
    from collectives.logs import configure_logging
    from collectives.spares import SparePool

    configure_logging()

    from mpi4py import MPI

    from .trainer import train

    world = _world()
    # What a replacement for a dead rank runs (--replace): this program, with this command line.
    command = [sys.executable, "-m", "experiments.train", *(sys.argv[1:] if argv is None else argv)]
    if MPI.Comm.Get_parent() != MPI.COMM_NULL:  # a replacement the survivors started
        return _replacement(args, command)
    try:
        pool = SparePool(world, args.spares)  # every rank finds the same problem, before any message
    except ValueError as exc:
        if world.Get_rank() == 0:
            print(f"experiments.train: error: --spares: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if pool.is_spare:
        return _replacement(args, command, pool)
    members = pool.members
    try:
        with Communicator(members) as comm:
            status = train(args, members, comm, command, pool if pool.ranks else None)
    except UsageError as exc:
        if members.Get_rank() == 0:
            print(f"experiments.train: error: {exc}", file=sys.stderr)
            pool.release()  # no rank has died yet: rank 0 is the first one's
        return EXIT_USAGE
    except Exception:
        lines = traceback.format_exc().rstrip().splitlines()
        print("\n".join(f"[rank {world.Get_rank()}] {line}" for line in lines), file=sys.stderr, flush=True)
        world.Abort(1)
        return 1
    return EXIT_STOPPED if status == "stopped" else 0


def _replacement(args, command, spares=None) -> int:
    """A replacement's run (:func:`experiments.trainer.join_training`), or
    with ``spares`` a spare's, which waits first, torch not imported yet,
    and waits again where a rank's death interrupted its join (the members
    call it first next time: :meth:`collectives.spares.SparePool.wait`):
    exit status 0 when it completed with the others or was let go unused,
    1 when the job refused a started replacement (its error says why)."""
    while True:
        called = spares.wait() if spares is not None else None
        if spares is not None and called is None:
            return 0
        from .trainer import join_training

        try:
            status = join_training(args, command, spares, called)
        except PermissionError as exc:
            if spares is not None:
                print(f"experiments.train: spare not taken, waiting for the next call: {exc}", file=sys.stderr)
                continue
            print(f"experiments.train: replacement refused: {exc}", file=sys.stderr)
            return 1
        return EXIT_STOPPED if status == "stopped" else 0


if __name__ == "__main__":
    sys.exit(main())
