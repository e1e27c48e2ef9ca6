"""Per-rank checkpoints that every rank writes at the same step, so a requeued job continues.

Layout of ``--checkpoint-dir``::

    rank00003.step000120.pt   one file per member and checkpoint step (torch.save)
    latest.json               the last step every member saved:
                              {"step": 120, "ranks": 7, "rows": 8,
                               "members": [0, 1, 2, 4, 5, 6, 7], "left": [...]}

A file is named by the member's *row*: its rank in the run's first
communicator, the row of the run file it records into; ``members`` lists
the rows of the ranks that saved, in rank order, and ``rows`` how many
ranks the run began with (a run whose ranks never changed has members
``0 .. ranks - 1``).  A checkpoint is taken at a step all ranks agree on;
each rank writes its file (to a temporary name, then ``os.replace``), the
ranks meet in a barrier, and only then rank 0 points ``latest.json`` at
the new step and every rank deletes its older files.  A job killed at any
moment therefore leaves a ``latest.json`` naming a step for which every
member's file exists.

Resuming on the ranks that are left.  Where a rank dies without MPI fault
tolerance the launcher ends the job; ``python -m experiments.checkpoint
without DIR --of P RANK...`` (what ``slurm/train-job.sh`` runs then) takes
the dead ranks out of ``members`` and notes them in ``left``, and the job
is started again with ``--resume`` on as many ranks as are left.  Rank i
of the new job is member ``members[i]``: it loads that member's file (its
own replica, as at the checkpoint) and records into its row, reads that
row's data shard and, like a ULFM survivor (:mod:`wagma.membership`), a
slice of each dead row's batch, so the global batch stays the same; the
resumed run records the change in the run file.  ``latest.json`` at step 0
names no files: the run starts from the seeded model, on the members left.

A checkpoint holds tensors and plain data only (the model's, the
optimizer's and the algorithm's ``state_dict``, counters, the RNG state),
and is read back with ``torch.load(weights_only=True)``, which rebuilds
nothing else: a checkpoint directory on a cluster's shared scratch can be
written by others, and unpickling an arbitrary object runs the code it
names, on every rank, at the next resume.
"""

import argparse
import glob
import json
import os
import pickle
import re
import sys
from dataclasses import dataclass, field

from collectives.agreement import agree

__all__ = [
    "Latest",
    "checkpoint_path",
    "drop_members",
    "load_checkpoint",
    "read_latest",
    "read_state",
    "save_checkpoint",
]


def checkpoint_path(directory, row, step):
    """The file of the member of row ``row``'s state at ``step`` in ``directory``."""
    return os.path.join(directory, f"rank{row:05d}.step{step:09d}.pt")


@dataclass
class Latest:
    """``latest.json``: the checkpoint a resumed run goes on from."""

    #: The step every member saved (0: the seeded start, no files).
    step: int
    #: The rows (ranks of the run's first communicator) of the members, in rank order.
    members: list[int]
    #: The ranks the run began with.
    rows: int
    #: The members that died since, not yet recorded by a resumed run:
    #: ``{"row": R, "died_at": unix seconds or None}``.
    left: list[dict] = field(default_factory=list)

    @classmethod
    def read(cls, directory):
        """The record in ``directory``, or None where there is none (a
        record of before members were kept reads as members ``0 .. ranks - 1``)."""
        path = os.path.join(directory, "latest.json")
        if not os.path.exists(path):
            return None
        with open(path) as f:
            meta = json.load(f)
        members = meta.get("members", list(range(meta["ranks"])))
        return cls(int(meta["step"]), members, int(meta.get("rows", meta["ranks"])), meta.get("left", []))

    def write(self, directory):
        """Put this record in ``directory`` (a temporary name, then ``os.replace``)."""
        path = os.path.join(directory, "latest.json")
        meta = {"step": self.step, "ranks": len(self.members), "rows": self.rows, "members": self.members}
        if self.left:
            meta["left"] = self.left
        with open(path + ".tmp", "w") as f:
            json.dump(meta, f)
        os.replace(path + ".tmp", path)


def read_latest(directory, rank, ranks):
    """The checkpoint in ``directory`` that rank ``rank`` of a run of
    ``ranks`` ranks resumes from, or None where there is none.  Local:
    the caller agrees on the outcome with the other ranks.

    Raises:
        ValueError: naming the folder, where the checkpoint's members are
            not ``ranks`` ranks, or this rank's member's file is missing.
    """
    latest = Latest.read(directory)
    if latest is None:
        return None
    if len(latest.members) != ranks:
        raise ValueError(
            f"--checkpoint-dir {directory} holds a checkpoint of {len(latest.members)} ranks; "
            f"this run has {ranks} (resume with {len(latest.members)} ranks)"
        )
    row = latest.members[rank]
    if latest.step and not os.path.exists(checkpoint_path(directory, row, latest.step)):
        raise ValueError(f"--checkpoint-dir {directory}: row {row}'s file of step {latest.step} is missing")
    return latest


def drop_members(directory, dead, ranks, died_at=None):
    """Take the ranks ``dead`` (ranks of the job of ``ranks`` ranks that
    just ended) out of the checkpoint in ``directory`` and note them as
    ``left``; where there is no checkpoint yet, one at step 0 (the seeded
    start) is made of the other ranks.  Returns the record written.

    Raises:
        ValueError: the checkpoint is not of ``ranks`` ranks, a rank of
            ``dead`` is not one of them, or none would be left.
    """
    latest = Latest.read(directory) or Latest(0, list(range(ranks)), ranks)
    if len(latest.members) != ranks:
        raise ValueError(f"{directory} holds a checkpoint of {len(latest.members)} ranks, not of the job's {ranks}")
    dead = sorted(set(dead))
    if not dead or any(not 0 <= r < ranks for r in dead):
        raise ValueError(f"the dead ranks must be ranks of the job, 0 .. {ranks - 1}; got {dead}")
    if len(dead) == ranks:
        raise ValueError(f"no rank of the job's {ranks} is left to resume on")
    latest.left = latest.left + [{"row": latest.members[r], "died_at": died_at} for r in dead]
    latest.members = [m for r, m in enumerate(latest.members) if r not in dead]
    os.makedirs(directory, exist_ok=True)
    latest.write(directory)
    return latest


def save_checkpoint(comm, directory, step, state: dict, members, rows):
    """Write this rank's ``state`` for ``step``, under its row
    ``members[comm.rank]``; collective (two barriers).  ``members``: the
    rows of the ranks of ``comm``; ``rows``: the ranks the run began with."""
    import torch  # here, not at import: the command line (between a failed launch and the relaunch) needs none

    os.makedirs(directory, exist_ok=True)
    row = members[comm.rank]
    target = checkpoint_path(directory, row, step)
    torch.save(state, target + ".tmp")
    os.replace(target + ".tmp", target)
    comm.control.Barrier()
    if comm.rank == 0:
        Latest(step, list(members), rows).write(directory)
    comm.control.Barrier()
    for old in glob.glob(os.path.join(directory, f"rank{row:05d}.step*.pt")):
        if old != target:
            os.remove(old)
    if comm.rank == 0:  # the files of rows that left (ranks that died) are no one's now
        for old in glob.glob(os.path.join(directory, "rank*.step*.pt")):
            if int(re.match(r"rank(\d+)\.", os.path.basename(old))[1]) not in members:
                os.remove(old)


def read_state(path) -> dict:
    """The state in checkpoint file ``path``, tensors on the CPU.

    Raises:
        ValueError: naming ``path``, whatever went wrong: it holds more
            than tensors and plain data (an object whose unpickling would
            run code: refused, never built), or it is not a checkpoint
            (missing, cut short, corrupt).
    """
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch.load raises many kinds; each caller needs one, naming the file
        # A refusal names the global the file asked for (torch's message goes on to say how to
        # load it anyway: not repeated); any other failure is a file that is not a checkpoint.
        named = re.search(r"Unsupported global: GLOBAL (\S+)", str(error))
        if isinstance(error, pickle.UnpicklingError) and named:
            raise ValueError(
                f"{path} holds more than tensors and plain data ({named[1]}), which no checkpoint "
                f"of this framework does: refused, not unpickled"
            ) from None
        unpickler = re.search(r"WeightsUnpickler error:\s*([^\n]+)", str(error))
        detail = unpickler[1] if unpickler else str(error).split(". ")[0]
        what = f"{type(error).__name__}: {detail}" if detail else type(error).__name__
        raise ValueError(f"{path} is not a readable checkpoint: {what}") from None


def load_checkpoint(comm, directory, step, row) -> dict:
    """The state that row ``row`` saved at ``step`` (:func:`read_state`);
    collective: a file refused or unreadable on any rank raises
    ``ValueError`` on every rank, naming it, before the job goes on."""
    state, problem = None, None
    try:
        state = read_state(checkpoint_path(directory, row, step))
    except ValueError as error:
        problem = str(error)
    agree(comm, "--resume", problem, ValueError)
    return state


def main(argv=None) -> int:
    """``python -m experiments.checkpoint without DIR --of P RANK...`` (prints the ranks left)
    and ``ranks DIR --default P`` (prints the ranks a resumed run needs)."""
    parser = argparse.ArgumentParser(
        prog=".venv/bin/python -m experiments.checkpoint", description="Checkpoint folders of experiments.train."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    without = commands.add_parser(
        "without",
        help="take ranks that died out of a checkpoint, to resume on the others",
        description="After a job of P ranks ended because ranks died (no MPI fault tolerance), take those "
        "ranks out of the latest checkpoint in DIR (or of a checkpoint at step 0 where there is none yet) "
        "and print how many ranks are left: the same command line with --resume on that many ranks goes on "
        "from the checkpoint, the dead ranks' data shared among the others.",
    )
    without.add_argument("directory", metavar="DIR", help="the run's --checkpoint-dir")
    without.add_argument("dead", metavar="RANK", type=int, nargs="+", help="a rank of the job that died")
    without.add_argument("--of", dest="ranks", type=int, required=True, metavar="P", help="the job's rank count")
    without.add_argument("--died-at", type=float, help="when the first of them died (seconds since the epoch)")
    ranks = commands.add_parser(
        "ranks",
        help="print how many ranks resume from the checkpoint",
        description="Print the rank count a run resumed from the latest checkpoint in DIR must have "
        "(its members), or --default where DIR holds no checkpoint.",
    )
    ranks.add_argument("directory", metavar="DIR", help="the run's --checkpoint-dir")
    ranks.add_argument("--default", type=int, required=True, metavar="P", help="what to print without a checkpoint")
    args = parser.parse_args(argv)
    if args.command == "ranks":
        latest = Latest.read(args.directory)
        print(len(latest.members) if latest else args.default)
        return 0
    try:
        latest = drop_members(args.directory, args.dead, args.ranks, args.died_at)
    except (ValueError, OSError) as error:
        print(f"experiments.checkpoint: error: {error}", file=sys.stderr)
        return 2
    print(len(latest.members))
    return 0


if __name__ == "__main__":
    sys.exit(main())
