"""Per-rank checkpoints that every rank writes at the same step, so a requeued job continues.

Layout of ``--checkpoint-dir``::

    rank00003.step000120.pt   one file per rank and checkpoint step (torch.save)
    latest.json               {"step": 120, "ranks": 8}: the last step every rank saved

A checkpoint is taken at a step all ranks agree on; each rank writes its
file (to a temporary name, then ``os.replace``), the ranks meet in a
barrier, and only then rank 0 points ``latest.json`` at the new step and
every rank deletes its older files.  A job killed at any moment therefore
leaves a ``latest.json`` naming a step for which every rank's file exists.

A checkpoint holds tensors and plain data only (the model's, the
optimizer's and the algorithm's ``state_dict``, counters, the RNG state),
and is read back with ``torch.load(weights_only=True)``, which rebuilds
nothing else: a checkpoint directory on a cluster's shared scratch can be
written by others, and unpickling an arbitrary object runs the code it
names, on every rank, at the next resume.
"""

import glob
import json
import os
import pickle
import re

import torch

from collectives.agreement import agree

__all__ = ["checkpoint_path", "latest_step", "load_checkpoint", "read_state", "save_checkpoint"]


def checkpoint_path(directory, rank, step):
    """The file of rank ``rank``'s state at ``step`` in ``directory``."""
    return os.path.join(directory, f"rank{rank:05d}.step{step:09d}.pt")


def latest_step(comm, directory):
    """The step of the latest complete checkpoint, or None.

    Collective over ``comm`` (a :class:`~collectives.Communicator`): every
    rank must see the same ``latest.json``, written for as many ranks, and
    its own file of that step, or every rank raises ``ValueError``.
    """
    path = os.path.join(directory, "latest.json")
    found = None
    problem = None
    if os.path.exists(path):
        with open(path) as f:
            meta = json.load(f)
        if meta["ranks"] != comm.size:
            problem = (
                f"--checkpoint-dir {directory} holds a checkpoint of {meta['ranks']} ranks; "
                f"this run has {comm.size} (resume with the same number of ranks)"
            )
        elif not os.path.exists(checkpoint_path(directory, comm.rank, meta["step"])):
            problem = f"--checkpoint-dir {directory}: rank {comm.rank}'s file of step {meta['step']} is missing"
        else:
            found = int(meta["step"])
    agree(comm, "--resume", problem, ValueError, step=found)
    return found


def save_checkpoint(comm, directory, step, state: dict):
    """Write this rank's ``state`` for ``step``; collective (two barriers)."""
    os.makedirs(directory, exist_ok=True)
    rank = comm.rank
    target = checkpoint_path(directory, rank, step)
    torch.save(state, target + ".tmp")
    os.replace(target + ".tmp", target)
    comm.control.Barrier()
    if rank == 0:
        meta = os.path.join(directory, "latest.json")
        with open(meta + ".tmp", "w") as f:
            json.dump({"step": step, "ranks": comm.size}, f)
        os.replace(meta + ".tmp", meta)
    comm.control.Barrier()
    for old in glob.glob(os.path.join(directory, f"rank{rank:05d}.step*.pt")):
        if old != target:
            os.remove(old)


def read_state(path) -> dict:
    """The state in checkpoint file ``path``, tensors on the CPU.

    Raises:
        ValueError: naming ``path``, whatever went wrong: it holds more
            than tensors and plain data (an object whose unpickling would
            run code: refused, never built), or it is not a checkpoint
            (missing, cut short, corrupt).
    """
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


def load_checkpoint(comm, directory, step) -> dict:
    """This rank's state saved at ``step`` (:func:`read_state`); collective:
    a file refused or unreadable on any rank raises ``ValueError`` on every
    rank, naming it, before the job goes on."""
    state, problem = None, None
    try:
        state = read_state(checkpoint_path(directory, comm.rank, step))
    except ValueError as error:
        problem = str(error)
    agree(comm, "--resume", problem, ValueError)
    return state
