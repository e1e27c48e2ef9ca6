"""Spare ranks: processes started with the job, idle until a rank dies, then members in its place.

A job started with P + K ranks keeps its last K ranks of ``MPI_COMM_WORLD``
as spares (:class:`SparePool`): the first P train on their own
communicator (:attr:`SparePool.members`), the spares wait.  When members
died and the survivors call for replacements, the survivors' rank 0 calls
the next spares, point to point on the world, and the survivors and those
spares build their communicator by ``MPI_Comm_shrink`` (ULFM) of
communicators the pool built at the start (:meth:`SparePool.call`): a
rank that dies meanwhile is left out, not waited for.  What does not work
with the Open MPI 5.0.11 wheel once a rank of the world has died:
``MPI_Comm_create_group`` and ``MPI_Intercomm_create`` over the world fail
(``MPI_ERR_PROC_FAILED``, ``MPI_ERR_INTERN``), and
``MPI_Comm_create_from_group`` (MPI-4), which needs no parent
communicator, waits for ever (spinning) where one of the group dies
during the call.

Why spares and not only ``MPI_Comm_spawn`` (:func:`wagma.healing.replace`
does both): with the Open MPI 5.0.11 wheel a second generation of spawned
processes aborts the job, so spawning replaces once; spares replace as
many times as there are spares, every spare being of the first launch.
And a batch system starts them inside the allocation like any task
(``srun -n P+K``), with no support for spawning needed.

Who may join: only ranks of this job's ``MPI_COMM_WORLD``, which the
job's launcher started; the new communicator is built from the world's,
which no process outside the job belongs to, so no secret is
checked (the spawned path proves the job's secret,
:mod:`collectives.admission`).

An idle spare costs little: it imports MPI and nothing more until it is
called (about 27 MB of memory; 108 ranks start in 7 s on 2 cores), and it
waits by probing every :data:`POLL_S` seconds and sleeping in between, not
in a blocking receive, which Open MPI serves by spinning: K spinning
spares would take the cores from the members.  The pool's start is what
costs: K splits of the whole world, one communicator per spare, each a
collective of P + K processes that spin while it runs.  On 2 cores a
job of 8 members and 110 spares ran 50 steps in 157 s (8 ranks alone:
100 steps in 22 s), and one of 8 and 170 had not started training after
400 s: ask for the spares the failures to come need, not more.
"""

from __future__ import annotations

import logging
import time

from mpi4py import MPI

from .failures import any_source, failed_ranks, fault_tolerant, hold, release_context_ids, track

__all__ = ["POLL_S", "SparePool"]

logger = logging.getLogger(__name__)

#: Seconds between a waiting spare's probes for its call (the mean delay it adds to a replacement is half).
POLL_S = 0.1
_TAG_CALL = 4250  # the survivors' rank 0 to a spare, on the world: its call, or None at the end of the run


class SparePool:
    """The job's spares, the last ``count`` ranks of ``world``.

    Built collectively over ``world``.  On a member,
    :attr:`SparePool.members` is the first ranks' communicator and
    :meth:`SparePool.call` brings in spares; on a spare,
    :meth:`SparePool.wait` blocks until the spare is called or let go.

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
        #: How many spares were called so far, in the pool's order (the same on every member).
        self.used = 0
        #: The members' communicator (the first ranks of ``world``; ``world``
        #: itself where there are no spares), ``MPI_COMM_NULL`` on a spare.
        self.members: MPI.Intracomm = world
        if count:
            world.Set_errhandler(MPI.ERRORS_RETURN)
            # mpi4py's stub types Split as returning a Comm; an Intracomm's gives an Intracomm.
            comm: MPI.Intracomm = world.Split(MPI.UNDEFINED if self.is_spare else 0, world.Get_rank())  # type: ignore[assignment]
            self.members = track(comm) if comm != MPI.COMM_NULL else comm
        #: Per spare, the world's ranks up to it (:meth:`call`); built now, while no rank has died.
        #: Not tracked (collectives.failures.track): a recovery does not revoke them, which would
        #: cost a message to every rank of each per failure, and a shrink needs none.
        self._bridges: dict[int, MPI.Intracomm] = {}
        for spare in self.ranks:
            bridge: MPI.Intracomm = world.Split(0 if world.Get_rank() <= spare else MPI.UNDEFINED, world.Get_rank())  # type: ignore[assignment]
            if bridge != MPI.COMM_NULL:
                bridge.Set_errhandler(MPI.ERRORS_RETURN)
                self._bridges[spare] = bridge

    @property
    def is_spare(self) -> bool:
        """Whether this process is one of the pool's spares (it was started to wait)."""
        return self.world.Get_rank() in self.ranks

    def available(self) -> list[int]:
        """The world ranks of the spares not called yet and not known dead, in the pool's order (local)."""
        dead = failed_ranks(self.world)
        return [r for r in self.ranks[self.used :] if r not in dead]

    def wait(self, poll_s: float = POLL_S) -> MPI.Intracomm | None:
        """On a spare: wait to be called; returns the communicator it now
        belongs to (the members, then the spares called with it), or None
        where the run ended without it (the members let it go, or every rank
        that could call it has died: the world ranks below it).

        A call that a rank's death interrupts (the communicator built holds
        a rank too few, :meth:`call`) leaves this spare waiting again: the
        members put it back (:meth:`put_back`) and call it first next time,
        so that a stream of failures costs no spare but those that take a
        row.  Call it again, too, where the join that follows a call fails
        (:func:`wagma.healing.join`).
        """
        me = self.world.Get_rank()
        status = MPI.Status()
        callers = set(range(me))  # the members, and the spares called before this one
        while True:
            while not any_source(self.world, self.world.Iprobe, MPI.ANY_SOURCE, _TAG_CALL, status):
                if callers <= failed_ranks(self.world):
                    return None
                time.sleep(poll_s)
            call = self.world.recv(source=status.Get_source(), tag=_TAG_CALL)
            if call is None:
                return None
            self.used = call["used"]
            try:
                return self._bring_in(call["spares"][call["spares"].index(me) :], call["size"])
            except MPI.Exception as error:
                if error.Get_error_class() != MPI.ERR_PROC_FAILED:
                    raise
                logger.warning("spare %d not brought in (%s): waiting for the next call", me, error.__cause__)

    def call(self, comm: MPI.Intracomm, spares: list[int]) -> MPI.Intracomm:
        """On the members (collective over ``comm``, whose processes are all
        of the world, in the world's order, as every communicator this pool
        builds is): call the ``spares`` (world ranks, from :meth:`available`,
        the same on every member) and return the communicator of the
        members, in their order, then the spares.

        How, without a collective over the world, which a dead rank fails:
        the pool built, for each spare ``s``, a communicator of the world's
        ranks up to ``s`` (the first members, the spares before ``s``, and
        ``s``) when the job started; every rank alive in it now is a member
        or ``s``, since spares are called in order, so its
        ``MPI_Comm_shrink`` (fault tolerant: a rank that dies during it is
        left out) is the members and ``s``.  Each spare called shrinks its
        own and the later ones'.

        Raises:
            MPI.Exception: ``MPI_ERR_PROC_FAILED``, on every process, where
                a member or a spare died while the communicator was built
                (it holds fewer ranks than it should, and none can tell
                which rows it holds); the reason is its ``__cause__``.  The
                spares called are put back (:meth:`put_back`).
        """
        world_group, everyone = self.world.Get_group(), comm.Get_group()
        try:
            ranks = list(MPI.Group.Translate_ranks(everyone, list(range(comm.Get_size())), world_group))
        finally:
            everyone.Free()
            world_group.Free()
        if ranks != sorted(ranks) or ranks[-1] >= spares[0]:
            raise RuntimeError(f"the members' world ranks {ranks} are not in order before the spares {spares}")
        before, self.used = self.used, self.ranks.index(spares[-1]) + 1
        size = comm.Get_size() + len(spares)
        try:
            if comm.Get_rank() == 0:
                for spare in spares:
                    self.world.send({"spares": spares, "size": size, "used": self.used}, dest=spare, tag=_TAG_CALL)
            return self._bring_in(spares, size)
        except MPI.Exception:
            self.put_back(before)  # the spares called wait again (wait), and are called first next time
            raise

    def put_back(self, used: int) -> None:
        """On the members, where a call failed (every member alike): the
        spares called since :attr:`used` was ``used`` wait again (:meth:`wait`),
        and the next call starts with them, in the pool's order, as every
        later call must (a spare left waiting below a called one would stall
        that one's shrink, :meth:`call`)."""
        self.used = used

    def _bring_in(self, spares: list[int], size: int) -> MPI.Intracomm:
        """Shrink the communicators of ``spares`` in turn (see :meth:`call`); the last one."""
        comm: MPI.Intracomm = MPI.COMM_NULL  # type: ignore[assignment]  # replaced: spares holds one at least
        release_context_ids()  # a constructor a failure ended (a join given up) would hold these shrinks forever
        for spare in spares:
            comm = self._bridges[spare].Shrink()  # type: ignore[assignment]  # an Intracomm's is one
        if comm.Get_size() != size:
            # Every process of the shrink sees the same size, so all raise: as a rank's failure, which
            # the members recover from as from any (wagma.membership.survive), and a spare waits for its next call.
            # The communicator is left as it is, neither revoked nor tracked (a recovery revokes what is
            # tracked): with Open MPI 5.0.11 a revoke that reaches a process still inside the shrink
            # that made the communicator crashes it (SIGSEGV in ompi_comm_revoke_local).
            hold(comm)
            why = f"a rank died while spares {spares} were brought in: {comm.Get_size()} ranks of the {size} expected"
            raise MPI.Exception(MPI.ERR_PROC_FAILED) from RuntimeError(why)
        return track(comm)

    def release(self) -> None:
        """At the end of the run, on the members' rank 0: let the spares
        still waiting go (:meth:`wait` returns None on them).  A spare that
        died meanwhile is passed over."""
        for spare in self.available():
            try:
                self.world.send(None, dest=spare, tag=_TAG_CALL)
            except MPI.Exception:
                continue
