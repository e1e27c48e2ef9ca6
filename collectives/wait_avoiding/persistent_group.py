"""The blocking group allreduce bound to one buffer: checked once, then an index per call.

:func:`~collectives.wait_avoiding.group_allreduce.group_allreduce` checks
its arguments, builds the grouping and this rank's plan, and looks up its
schedule (and, for ``"mpi"``, the group's communicator) on every call:
about 9 us of Python at 4 KiB on one rank, more than the library's whole
``MPI_Allreduce`` of a small buffer within a group of 2 to 4 ranks.
:class:`PersistentGroupAllreduce` does all of that once, as
:class:`~collectives.schedules.blocking.PersistentAllreduce` does for
:func:`~collectives.schedules.blocking.allreduce`, and keeps one bound
call per iteration of the grouping's period (the groups repeat after it,
:attr:`~collectives.wait_avoiding.groups.ButterflyGrouping.period`).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from ..buffers import Buffer
from ..schedules.blocking import Op
from ..schedules.library import bound_library_allreduce, host_array
from .group_allreduce import (
    GroupAllreduceAlgorithm,
    GroupAllreduceChoice,
    check_group_arguments,
    choose_group_allreduce,
    group_communicators,
    group_schedule,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..comm import Communicator
    from .groups import GroupPlan

__all__ = ["PersistentGroupAllreduce", "group_allreduce_init"]


class PersistentGroupAllreduce:
    """:func:`~collectives.wait_avoiding.group_allreduce.group_allreduce`
    bound to one buffer, its arguments checked once.

    Construction is collective over ``comm``: it checks the arguments on
    every rank together (what ``group_allreduce`` refuses, it refuses, with
    the same message), resolves ``algorithm="auto"``, and binds this rank's
    plan and schedule for each iteration of the grouping's period; with
    ``"mpi"`` on a numpy array or CPU tensor, iteration t's call is the
    library's ``MPI_Allreduce`` on the communicator of t's group (and the
    scaling of ``op="avg"``) and nothing else.  ``reduce(t)`` then reduces
    the bound buffer within this rank's group of iteration ``t``: the
    result, order of additions included, is ``group_allreduce``'s with the
    same arguments, bit for bit.

    The buffer is bound: write each call's input into it.  Every rank calls
    with the same ``t`` in the same order, as ``group_allreduce`` requires;
    that is not checked (the check is the round trip the binding saves).

    Args:
        data, comm, group_size, op, algorithm, dynamic_groups: as for
            ``group_allreduce``.

    Raises:
        ValueError, TypeError: on every rank, before any data moves.

    Example::

        average = group_allreduce_init(params, comm=comm, group_size=4, op="avg")
        for t in range(steps):
            ...  # update params
            average(t)
    """

    #: The bound buffer.
    data: Buffer
    comm: Communicator
    op: Op
    #: The schedule each call runs (``auto`` resolved).
    algorithm: GroupAllreduceChoice

    def __init__(
        self,
        data: Buffer,
        *,
        comm: Communicator,
        group_size: int,
        op: Op = "sum",
        algorithm: GroupAllreduceAlgorithm = "auto",
        dynamic_groups: bool = True,
    ) -> None:
        grouping, _ = check_group_arguments(
            "group_allreduce_init", data, comm, group_size, 0, op, algorithm, dynamic_groups, True
        )
        self.data, self.comm, self.op = data, comm, op
        self.algorithm = choose_group_allreduce(data.nbytes) if algorithm == "auto" else algorithm
        self.group_size = group_size
        array = host_array(data) if self.algorithm == "mpi" else None
        if array is None:
            schedule = group_schedule(self.algorithm, comm, grouping, data.nbytes)
        else:
            groups = group_communicators(comm, grouping)
        self._calls: list[Callable[[], object]] = []
        for t in range(grouping.period):
            plan = grouping.plan(t, comm.rank)
            scale = 1.0 / plan.size if op == "avg" else None
            self._calls.append(
                partial(_scheduled, schedule, data, comm, plan, scale)
                if array is None
                else bound_library_allreduce(groups.communicator(plan.members), array, scale)
            )

    def __call__(self, t: int) -> None:
        """Reduce the bound buffer within this rank's group of iteration ``t`` (>= 0)."""
        if t < 0:
            raise ValueError(f"group_allreduce_init: t must be >= 0, got {t!r}")
        self._calls[t % len(self._calls)]()

    def __repr__(self) -> str:
        return (
            f"PersistentGroupAllreduce(algorithm={self.algorithm!r}, op={self.op!r}, "
            f"group_size={self.group_size}, ranks={self.comm.size}, period={len(self._calls)})"
        )


def group_allreduce_init(
    data: Buffer,
    *,
    comm: Communicator,
    group_size: int,
    op: Op = "sum",
    algorithm: GroupAllreduceAlgorithm = "auto",
    dynamic_groups: bool = True,
) -> PersistentGroupAllreduce:
    """A :class:`PersistentGroupAllreduce` of ``data``: collective, checks once."""
    return PersistentGroupAllreduce(
        data, comm=comm, group_size=group_size, op=op, algorithm=algorithm, dynamic_groups=dynamic_groups
    )


def _scheduled(schedule: Callable[..., None], data: Buffer, comm: Communicator, plan: GroupPlan, scale) -> None:
    """One group allreduce of ``data`` by ``schedule`` (a butterfly, or
    the library's call on a buffer that needs staging)."""
    with comm.open_buffer(data) as buf:
        schedule(buf, comm, plan, scale)
