"""The library's ``MPI_Allreduce`` within the butterfly groups of WAGMA-SGD.

A group allreduce is an allreduce over the group's ranks.  Run as our
butterfly schedules (:mod:`~collectives.wait_avoiding.group_allreduce`) it
pays Python's cost per phase: log2 S exchanges, each posted, waited for and
added from Python.  For small buffers that cost is most of the time, where
the library's own ``MPI_Allreduce`` on a communicator of the group's ranks
pays it once.  :class:`GroupCommunicators` holds one such communicator per
group that this rank belongs to over a grouping's period, made once
(collectively, with every rank), and picks per group and buffer what
``allreduce(algorithm="auto")`` would pick over the group's ranks: the
tuning table of the group's own setting (its rank count and node shape)
where there is one, else the library wherever it may run
(:func:`~collectives.schedules.blocking.choose_allreduce`).  Every member of
a group reads the same table (its first rank's) and so takes the same
choice; different groups may choose differently, since no message of one
group's allreduce reaches another group.

Members of a group call the library on their communicator in the order of
the versions, as MPI requires of collectives on one communicator: every
rank executes the versions in order, one at a time, whichever thread does
(:class:`~collectives.wait_avoiding.progress.ProgressEngine`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mpi4py import MPI

from ..failures import revoked, track
from ..schedules.blocking import choose_allreduce
from ..schedules.library import LIBRARY_DTYPES
from ..schedules.tuning import TuningTable, load_tuning

if TYPE_CHECKING:
    from ..buffers import FlatBuffer
    from ..comm import Communicator
    from .group_allreduce import GroupAllreduceChoice
    from .groups import ButterflyGrouping

__all__ = ["GroupCommunicators", "library_group_allreduce"]


def library_group_allreduce(
    buf: FlatBuffer,
    group: MPI.Intracomm,
    scale: float | None = None,
    src: FlatBuffer | None = None,
) -> None:
    """Sum over ``group`` (the library's ``MPI_Allreduce``) into ``buf``, then
    ``scale``; the inputs are ``src`` where given (out of place), else ``buf``.

    Always the blocking ``MPI_Allreduce``, whoever runs it: a version may
    run on one member's main thread and on another's progress thread, and
    MPI matches a blocking collective only with blocking ones (MPI-4.1,
    section 6.12: "nonblocking collective operations do not match with
    blocking collective operations"); mixing ``MPI_Iallreduce`` on progress
    threads with ``MPI_Allreduce`` on main threads hung a 4-rank run.  The
    nonblocking call everywhere would match, but MPICH runs it over
    point-to-point schedules that progress only when tested: at 4 ranks on
    2 cores it took 1.06 ms at 4 KiB where the blocking call took 0.07 ms
    and our butterfly 0.34 ms (``collectives.bench wagma``).  So the call
    waits as the library waits (MPICH spins, Open MPI yields on an
    oversubscribed node), not as the caller's ``Communicator`` would.  An
    execution blocks its thread either way, as a butterfly's does.
    """
    datatype = LIBRARY_DTYPES[buf.dtype]
    recv = [buf.msg(0, buf.numel), buf.numel, datatype]
    send = MPI.IN_PLACE if src is None else [src.msg(0, buf.numel), buf.numel, datatype]
    group.Allreduce(send, recv, MPI.SUM)
    if scale is not None:
        buf.scale_(0, buf.numel, scale)


class GroupCommunicators:
    """This rank's butterfly groups as communicators, and the group
    allreduce that runs on them.

    Construction is collective over ``comm`` (every rank, the same
    ``grouping``): one ``MPI_Comm_split`` of ``comm.data`` per distinct
    partition of ranks over ``grouping``'s period, then each group's
    tuning table (collective within the group; a table that cannot be
    read raises ``ValueError`` on every rank of ``comm``, the communicators
    freed).  :meth:`choice` says what
    a group runs for a buffer, :meth:`communicator` gives the group's
    communicator (:func:`~collectives.wait_avoiding.group_allreduce.tuned_group_allreduce`
    runs the choice).

    Args:
        comm: the :class:`~collectives.comm.Communicator` the group
            allreduces run on (its data channel is split).
        grouping: the :class:`~collectives.wait_avoiding.groups.ButterflyGrouping`.
        algorithm: ``"auto"`` (each group's table, else the library) or
            ``"mpi"`` (the library for every group and buffer).
    """

    def __init__(self, comm: Communicator, grouping: ButterflyGrouping, algorithm: str = "auto") -> None:
        self.algorithm = algorithm
        self._groups: dict[tuple[int, ...], tuple[MPI.Intracomm, TuningTable | None]] = {}
        self._chosen: dict[tuple[tuple[int, ...], int, str], GroupAllreduceChoice] = {}
        partitions, problem = set(), None
        for t in range(grouping.period):
            groups = tuple(tuple(g) for g in grouping.groups(t))
            if groups in partitions:
                continue
            partitions.add(groups)
            mine = next(i for i, g in enumerate(groups) if comm.rank in g)
            group: MPI.Intracomm = track(comm.data.Split(mine, comm.rank))  # type: ignore[assignment]
            table = None
            try:
                table = load_tuning(group) if algorithm == "auto" else None  # "mpi" needs none
            except ValueError as exc:  # a table that cannot be read: its group's ranks alone know
                problem = problem or str(exc)
            self._groups[groups[mine]] = group, table
        # Said on every rank, as load_tuning says it over one communicator, not in some groups only.
        problems = [p for p in comm.control.allgather(problem) if p]
        if problems:
            self.close()
            raise ValueError(problems[0])

    def choice(self, members: tuple[int, ...], nbytes: int, dtype: str) -> GroupAllreduceChoice:
        """What the group of ``members`` runs for ``nbytes`` of ``dtype``:
        ``"mpi"`` (the library), or the butterfly that is ours of the
        table's pick (``"recursive_doubling"``, or ``"halving_doubling"``
        for a bandwidth-optimal pick)."""
        key = (members, nbytes, dtype)
        if key not in self._chosen:
            _, table = self._groups[members]
            picked = "mpi" if self.algorithm == "mpi" else choose_allreduce(nbytes, len(members), table, dtype)
            self._chosen[key] = picked if picked in ("mpi", "recursive_doubling") else "halving_doubling"
        return self._chosen[key]

    def communicator(self, members: tuple[int, ...]) -> MPI.Intracomm:
        """The communicator of the group of ``members``."""
        return self._groups[members][0]

    def close(self) -> None:
        """Free the communicators; those a failure revoked are not freed
        (peers may be dead: a free is collective)."""
        for group, _ in self._groups.values():
            if not revoked(group):
                group.Free()
        self._groups.clear()
