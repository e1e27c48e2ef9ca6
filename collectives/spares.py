"""Spare ranks: processes started with the job, idle until a rank dies, then members in its place.

A job started with P + K ranks keeps its last K ranks of ``MPI_COMM_WORLD``
as spares (:class:`SparePool`): the first P train on their own
communicator (:attr:`SparePool.members`), the spares wait.  When members
died and the survivors call for replacements, the survivors' rank 0 tells
the next spares, point to point on the world, which processes the new
communicator holds (the survivors in their order, then the spares in the
pool's order), and all of them build it with
``MPI_Comm_create_from_group`` (MPI-4): a call collective over the new
group alone, so the world's dead ranks take no part in it, where
``MPI_Comm_create_group`` and ``MPI_Intercomm_create`` over the world fail
(``MPI_ERR_PROC_FAILED``, ``MPI_ERR_INTERN``) once a rank of it has died.

Why spares and not only ``MPI_Comm_spawn`` (:func:`wagma.healing.replace`
does both): with the Open MPI 5.0.11 wheel a second generation of spawned
processes aborts the job, so spawning replaces once; spares replace as
many times as there are spares, every spare being of the first launch.
And a batch system starts them inside the allocation like any task
(``srun -n P+K``), with no support for spawning needed.

Who may join: only ranks of this job's ``MPI_COMM_WORLD``, which the
job's launcher started; the new communicator is built from the world's
group, which no process outside the job belongs to, so no secret is
checked (the spawned path proves the job's secret,
:mod:`collectives.admission`).

An idle spare costs little: it imports MPI and nothing more until it is
called (about 27 MB of memory; 108 ranks start in 7 s on 2 cores), and it
waits by probing every :data:`POLL_S` seconds and sleeping in between, not
in a blocking receive, which Open MPI serves by spinning: K spinning
spares would take the cores from the members.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from mpi4py import MPI

from .failures import any_source, failed_ranks, fault_tolerant, track

__all__ = ["POLL_S", "Activation", "SparePool"]

#: Seconds between a waiting spare's probes for its call (the mean delay it adds to a replacement is half).
POLL_S = 0.1
_TAG_CALL = 4250  # the survivors' rank 0 to a spare, on the world: its call, or None at the end of the run


@dataclass
class Activation:
    """What a spare receives when it is called: the communicator it now
    belongs to, with the survivors (ranks ``0 .. members - 1``) and the
    spares called with it, and how many of the pool's spares have been
    called so far (this one included)."""

    comm: MPI.Intracomm
    members: int
    used: int


class SparePool:
    """The last ``count`` ranks of ``world`` (collective over ``world``):
    on a member, :attr:`members` is the first ranks' communicator and
    :meth:`call` brings in spares; on a spare, :meth:`wait` blocks until
    the spare is called or let go.

    Raises:
        ValueError: on every rank, before any communication: ``count`` is not
            an int from 0 to ``world.size - 1`` (one member at least), or
            spares were asked for in a job without MPI fault tolerance
            (without it the first death ends the job, spares included).
    """

    def __init__(self, world: MPI.Intracomm, count: int):
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count < world.Get_size():
            raise ValueError(
                f"spares must be an int from 0 to {world.Get_size() - 1} (one rank of the "
                f"{world.Get_size()} must train), got {count!r}"
            )
        if count and not fault_tolerant():
            raise ValueError(
                f"{count} spares need a fault-tolerant job (Open MPI's mpiexec --with-ft ulfm, "
                "python -m experiments.mpirun --fault-tolerant): without it a death ends the job"
            )
        self.world = world
        self.ranks = list(range(world.Get_size() - count, world.Get_size()))
        #: How many spares were called, in the pool's order: the same on every member.
        self.used = 0
        #: The members' communicator (the first ranks of ``world``; ``world``
        #: itself where there are no spares), ``MPI_COMM_NULL`` on a spare.
        self.members: MPI.Intracomm = world
        if count:
            world.Set_errhandler(MPI.ERRORS_RETURN)
            comm = world.Split(MPI.UNDEFINED if self.is_spare else 0, world.Get_rank())
            self.members = track(comm) if comm != MPI.COMM_NULL else comm

    @property
    def is_spare(self) -> bool:
        """Whether this process is one of the pool's spares (it was started to wait)."""
        return self.world.Get_rank() in self.ranks

    def available(self) -> list[int]:
        """The world ranks of the spares not called yet and not known dead, in the pool's order (local)."""
        dead = failed_ranks(self.world)
        return [r for r in self.ranks[self.used :] if r not in dead]

    def wait(self, poll_s: float = POLL_S) -> Activation | None:
        """On a spare: wait to be called; returns the :class:`Activation`,
        or None where the run ended without it (the members let it go, or
        every rank that could call it has died: the world ranks below it)."""
        me = self.world.Get_rank()
        status = MPI.Status()
        callers = set(range(me))  # the members, and the spares called before this one
        while not any_source(self.world, self.world.Iprobe, MPI.ANY_SOURCE, _TAG_CALL, status):
            if callers <= failed_ranks(self.world):
                return None
            time.sleep(poll_s)
        call = self.world.recv(source=status.Get_source(), tag=_TAG_CALL)
        if call is None:
            return None
        self.used = call["used"]
        return Activation(self._communicator(call["ranks"], call["used"]), call["members"], call["used"])

    def call(self, comm: MPI.Intracomm, spares: list[int]) -> MPI.Intracomm:
        """On the members (collective over ``comm``, whose processes are all
        of the world): call the ``spares`` (world ranks, from
        :meth:`available`, the same on every member) and return the
        communicator of the members, in their order, then the spares."""
        everyone = comm.Get_group()
        world_group = self.world.Get_group()
        try:
            ranks = list(MPI.Group.Translate_ranks(everyone, list(range(comm.Get_size())), world_group))
        finally:
            everyone.Free()
            world_group.Free()
        self.used = self.ranks.index(spares[-1]) + 1
        if comm.Get_rank() == 0:
            call = {"ranks": ranks + list(spares), "members": len(ranks), "used": self.used}
            for spare in spares:
                self.world.send(call, dest=spare, tag=_TAG_CALL)
        return self._communicator(ranks + list(spares), self.used)

    def release(self) -> None:
        """At the end of the run, on the members' rank 0: let the spares
        still waiting go (:meth:`wait` returns None on them).  A spare that
        died meanwhile is passed over."""
        for spare in self.available():
            try:
                self.world.send(None, dest=spare, tag=_TAG_CALL)
            except MPI.Exception:
                continue

    def _communicator(self, ranks: list[int], used: int) -> MPI.Intracomm:
        world_group = self.world.Get_group()
        group = world_group.Incl(ranks)
        try:
            # The tag names this call among all the job's (one per number of spares used so far).
            comm = MPI.Intracomm.Create_from_group(group, f"wagma-spares-{used}", errhandler=MPI.ERRORS_RETURN)
        finally:
            group.Free()
            world_group.Free()
        return track(comm)
