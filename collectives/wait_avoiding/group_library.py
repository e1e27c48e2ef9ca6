"""The library's ``MPI_Allreduce`` within the butterfly groups of WAGMA-SGD.

A group allreduce is an allreduce over the group's ranks.  Run as our
butterfly schedules (:mod:`~collectives.wait_avoiding.group_allreduce`) it
pays Python's cost per phase: log2 S exchanges, each posted, waited for and
added from Python.  For small buffers that cost is most of the time, where
the library's own ``MPI_Allreduce`` on a communicator of the group's ranks
pays it once (``algorithm="mpi"``).  :class:`GroupCommunicators` holds one
such communicator per group that this rank belongs to over a grouping's
period, made once (collectively, with every rank).

It is not ``auto``'s choice: the butterflies add in an order of their own,
which :mod:`wagma.emulate` replays to give a recorded run's models bit for
bit, and the library's order is the library's (on 8 ranks, groups of 4,
MPICH's differed from the butterfly's in the last bit).

Members of a group call the library on their communicator in the order of
the versions, as MPI requires of collectives on one communicator: every
rank executes the versions in order, one at a time, whichever thread does
(:class:`~collectives.wait_avoiding.progress.ProgressEngine`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mpi4py import MPI

from ..failures import revoked, track

if TYPE_CHECKING:
    from ..comm import Communicator
    from .groups import ButterflyGrouping

__all__ = ["GroupCommunicators"]


class GroupCommunicators:
    """This rank's butterfly groups as communicators.

    Construction is collective over ``comm`` (every rank, the same
    ``grouping``): one ``MPI_Comm_split`` of ``comm.data`` per distinct
    partition of ranks over ``grouping``'s period.

    Args:
        comm: the :class:`~collectives.comm.Communicator` the group
            allreduces run on (its data channel is split).
        grouping: the :class:`~collectives.wait_avoiding.groups.ButterflyGrouping`.
    """

    def __init__(self, comm: Communicator, grouping: ButterflyGrouping) -> None:
        self._groups: dict[tuple[int, ...], MPI.Intracomm] = {}
        partitions = set()
        for t in range(grouping.period):
            groups = tuple(tuple(g) for g in grouping.groups(t))
            if groups in partitions:
                continue
            partitions.add(groups)
            mine = next(i for i, g in enumerate(groups) if comm.rank in g)
            group: MPI.Intracomm = track(comm.data.Split(mine, comm.rank))  # type: ignore[assignment]
            self._groups[groups[mine]] = group

    def communicator(self, members: tuple[int, ...]) -> MPI.Intracomm:
        """The communicator of the group of ``members``."""
        return self._groups[members]

    def close(self) -> None:
        """Free the communicators; those a failure revoked are not freed
        (peers may be dead: a free is collective)."""
        for group in self._groups.values():
            if not revoked(group):
                group.Free()
        self._groups.clear()
