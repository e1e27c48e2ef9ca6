"""Argument checks that every rank passes or fails together, before data moves."""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING

import numpy as np
from mpi4py import MPI

if TYPE_CHECKING:
    from .comm import Communicator

__all__ = ["agree", "check_arguments"]


def agree(
    comm: Communicator,
    collective: str,
    problem: str | None,
    exc_type: type[Exception] = ValueError,
    **fields: object,
) -> None:
    """Share each rank's verdict on its own arguments; raise on every rank.

    Every rank calls this once per collective call, with ``problem`` (None,
    or a sentence saying what is wrong with its arguments) and ``fields``
    (values that must be equal on every rank: element count, dtype, algorithm,
    group size, ...).  A mistake made on one rank thus raises the same error
    on all ranks instead of leaving the others waiting in a receive.

    Cost: one ``MPI_Allreduce(MAX)`` of 1 + 2 len(fields) integers on the
    control channel (a problem flag, and each field's hash h as h and -h, so
    that the maximum of -h is minus the minimum of h).  Only when that shows a
    problem or a disagreement does a second round gather every rank's
    arguments to name them in the message.

    Args:
        comm: a :class:`~collectives.comm.Communicator`.
        collective: the name used in messages (``"allreduce"``).
        problem: this rank's problem, or None.
        exc_type: the exception raised for this rank's problem.
        **fields: values that must agree across ranks.

    Raises:
        ValueError or TypeError: on every rank, naming the ranks concerned.
    """
    hashes = np.array([zlib.crc32(repr(v).encode()) for v in fields.values()], dtype=np.int64)
    summary = np.concatenate(([1 if problem else 0], hashes, -hashes))
    comm.control.Allreduce(MPI.IN_PLACE, summary, op=MPI.MAX)
    k = len(hashes)
    if summary[0] == 0 and np.array_equal(summary[1 : k + 1], -summary[k + 1 :]):
        return
    table = comm.control.allgather((problem, exc_type.__name__, tuple(fields.values())))
    failing: dict[tuple[str, str], list[int]] = {}
    for rank, (p, kind, _) in enumerate(table):
        if p:
            failing.setdefault((p, kind), []).append(rank)
    if failing:
        kinds: dict[str, type[Exception]] = {"TypeError": TypeError}
        kind = kinds.get(next(iter(failing))[1], ValueError)
        detail = "; ".join(f"{_ranks(ranks)}: {p}" for (p, _), ranks in failing.items())
        raise kind(f"{collective}: {detail}")
    for i, name in enumerate(fields):
        values = [row[2][i] for row in table]
        if any(v != values[0] for v in values):
            shown = ", ".join(f"rank {r}: {v}" for r, v in enumerate(values) if v != values[0] or r == 0)
            raise ValueError(f"{collective}: {name} must be the same on every rank, got {shown}")


def check_arguments(
    comm: Communicator, collective: str, problem: str | None, exc_type: type[Exception], check: bool, **fields: object
) -> None:
    """:func:`agree` when ``check``; otherwise raise this rank's problem, if
    any, on this rank alone (for callers that know the arguments agree)."""
    if check:
        agree(comm, collective, problem, exc_type, **fields)
    elif problem:
        raise exc_type(f"{collective}: {problem}")


def _ranks(ranks: list[int]) -> str:
    """``rank 3``, or ``ranks 0-2, 5`` for a sorted list of several."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    runs: list[str] = []
    start: int | None = ranks[0]
    following: list[int | None] = [*ranks[1:], None]
    for prev, cur in zip(ranks, following):
        if cur != prev + 1:
            runs.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = cur
    return "ranks " + ", ".join(runs)
