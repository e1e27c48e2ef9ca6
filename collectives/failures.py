"""What a communicator knows of failed ranks (ULFM), for code that must go on without them.

With Open MPI's ULFM (``mpiexec --with-ft ulfm``) a rank that dies does not
end the job: operations that involve it return ``MPI_ERR_PROC_FAILED``, and
receives and probes from ``MPI_ANY_SOURCE`` return
``MPI_ERR_PROC_FAILED_PENDING`` until the caller acknowledges the failures it
has been told of (``MPI_Comm_ack_failed``), since the message it waits for
might have come from the dead rank.  Point-to-point messages between living
ranks are unaffected.  Without fault tolerance (MPICH's wheel, or Open MPI
without ``--with-ft ulfm``) the launcher ends the job when a rank dies, and
these helpers see no failures.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from mpi4py import MPI

__all__ = [
    "FAILURE_CLASSES",
    "INTERRUPTION_CLASSES",
    "any_source",
    "every_one_done",
    "failed_ranks",
    "fault_tolerant",
    "hold",
    "mpi_failure",
    "release_context_ids",
    "revoke_tracked",
    "revoked",
    "shrink",
    "track",
    "wait",
    "waitall",
]

#: The error classes that mean "a rank of this communicator has failed".
FAILURE_CLASSES: frozenset[int] = frozenset(
    getattr(MPI, name) for name in ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING") if hasattr(MPI, name)
)

#: The error classes that end an operation because of a failure, a dead
#: rank's (:data:`FAILURE_CLASSES`) or a revoked communicator's
#: (``MPI_ERR_REVOKED``, which a survivor that noticed a failure sent so
#: that no rank stays blocked on a peer that went on to recover).
INTERRUPTION_CLASSES: frozenset[int] = FAILURE_CLASSES | (
    frozenset([MPI.ERR_REVOKED]) if hasattr(MPI, "ERR_REVOKED") and FAILURE_CLASSES else frozenset()
)


#: What the ``call`` of :func:`any_source` returns, which it hands back.
ResultT = TypeVar("ResultT")
#: The communicator :func:`track` is given, which it hands back.
CommT = TypeVar("CommT", bound=MPI.Comm)


def fault_tolerant(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this job was started with MPI fault tolerance: Open MPI's
    ULFM switch (``mpiexec --with-ft ulfm``, or the MCA parameter
    ``mpi_ft_enable``, both of which reach the ranks as
    ``OMPI_MCA_mpi_ft_enable=1``); the only library here that has it."""
    environ = os.environ if environ is None else environ
    return environ.get("OMPI_MCA_mpi_ft_enable", "0").lower() in ("1", "true", "yes", "enabled")


def failed_ranks(comm: MPI.Comm) -> set[int]:
    """The ranks of ``comm`` that MPI knows to have failed
    (``MPI_Comm_get_failed``); empty where the library has no such call."""
    try:
        group = comm.Get_failed()
    except (NotImplementedError, MPI.Exception):
        return set()
    if group.Get_size() == 0:
        if group != MPI.GROUP_EMPTY:
            group.Free()
        return set()
    everyone = comm.Get_group()
    try:
        return set(MPI.Group.Translate_ranks(group, list(range(group.Get_size())), everyone))
    finally:
        group.Free()
        everyone.Free()


def any_source(comm: MPI.Comm, call: Callable[..., ResultT], *args: Any) -> ResultT:
    """``call(*args)``, a receive or probe from ``MPI_ANY_SOURCE`` on
    ``comm``, retried after acknowledging the failures that made it return
    ``MPI_ERR_PROC_FAILED_PENDING`` (so that a dead rank cannot block
    messages from the living ones).  Other errors propagate."""
    while True:
        try:
            return call(*args)
        except MPI.Exception as error:
            if error.Get_error_class() not in FAILURE_CLASSES:
                raise
            comm.Ack_failed()


def _interruptions() -> frozenset[int]:
    """:data:`INTERRUPTION_CLASSES`, and under fault tolerance also the
    classes of a multiple completion (``MPI_Waitall``) one of whose requests
    failed: ``MPI_ERR_IN_STATUS`` (the failed request's status holds its
    class) and ``MPI_ERR_PENDING`` (a request left pending because another
    failed).  The schedules complete their transfers with ``Waitall``, so a
    peer that dies in the middle of one surfaces as these."""
    if not fault_tolerant():
        return INTERRUPTION_CLASSES
    return INTERRUPTION_CLASSES | {MPI.ERR_IN_STATUS, MPI.ERR_PENDING}


def _constructor_failure(error: MPI.Exception) -> bool:
    """Whether ``error`` is ``MPI_ERR_OTHER`` under fault tolerance while
    MPI knows of a failed process of the job: with the Open MPI 5.0.11
    wheel, a communicator constructor (``MPI_Comm_dup``, ``MPI_Comm_split``)
    whose peer died during its context-id agreement, which runs on
    nonblocking collectives, reports that class, not
    ``MPI_ERR_PROC_FAILED`` (seen in a chaos run: a WAGMA-SGD rank's
    ``Dup`` as two ranks failed 1.5 s into the run, the job aborted).
    Taken for a failure only once a failure is known, as the recovery
    that follows (:func:`wagma.membership.survive`) finds it."""
    return error.Get_error_class() == MPI.ERR_OTHER and fault_tolerant() and bool(failed_ranks(MPI.COMM_WORLD))


def mpi_failure(error: BaseException) -> MPI.Exception | None:
    """The ``MPI.Exception`` of a failure (:data:`INTERRUPTION_CLASSES`, or
    under fault tolerance ``MPI_ERR_OTHER`` once MPI knows of a failed
    process: a communicator constructor's whose peer died during it) that
    ``error`` is or was raised from (a progress thread's failure reaches the
    main thread as a ``RuntimeError`` whose cause is the thread's error), or
    None: ``error`` has nothing to do with a failed rank."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, MPI.Exception) and (
            current.Get_error_class() in _interruptions() or _constructor_failure(current)
        ):
            return current
        current = current.__cause__ or current.__context__
    return None


# Every communicator this process's collectives created, so that a rank that
# notices a failure can revoke them all: a peer blocked on any of them (a
# progress thread's control channel, an algorithm's private duplicate) would
# otherwise wait forever for a rank that went on to recover.
_tracked: weakref.WeakValueDictionary[int, MPI.Comm] = weakref.WeakValueDictionary()  # by id: unhashable
_tracked_lock = threading.Lock()


def every_one_done(comm: MPI.Intracomm, done: bool) -> bool:
    """Whether every process of ``comm`` alive now says ``done``: the
    fault-tolerant agreement of ULFM (``MPIX_Comm_agree``), which works on
    a revoked communicator and gives every process the same answer.  Where
    it reports a failure (``MPI_ERR_PROC_FAILED``: a process of ``comm``
    died, and the answer is lost in mpi4py's exception), the answer is no,
    on every process, as the error of the agreement is the same on all.

    What it is for: ULFM reports a failure to the processes whose
    operations needed the dead one, not to all; an operation that may end
    with some processes going on and others recovering ends with this
    agreement, each saying whether it got through (a process that failed
    revokes first, :func:`revoke_tracked`, so that none stays blocked)."""
    try:
        return bool(comm.Agree(int(done)))
    except MPI.Exception as error:
        if mpi_failure(error) is None:
            raise
        return False


def track(comm: CommT) -> CommT:
    """Register ``comm`` (a duplicate or split this package made) for
    :func:`revoke_tracked`; returns it.  Freed communicators drop out."""
    with _tracked_lock:
        _tracked[id(comm)] = comm
    return comm


def revoked(comm: MPI.Comm) -> bool:
    """Whether ``comm`` was revoked (ULFM); False where the library has no ULFM."""
    try:
        return bool(comm.Is_revoked())
    except (NotImplementedError, MPI.Exception):
        return False


def revoke_tracked() -> None:
    """``MPI_Comm_revoke`` every tracked communicator that is still open:
    every pending and later operation on them, on every rank, ends with
    ``MPI_ERR_REVOKED`` (ULFM).  Local and without effect where the library
    has no ULFM; a communicator already revoked is skipped quietly."""
    with _tracked_lock:
        comms = [c for c in _tracked.values() if c != MPI.COMM_NULL]
    for comm in comms:
        try:
            comm.Revoke()
        except (NotImplementedError, MPI.Exception):
            pass


def release_context_ids() -> None:
    """Free Open MPI's context-id allocator of a communicator constructor
    that a failure ended: a duplicate of ``MPI_COMM_SELF``, freed at once.

    Why: Open MPI (5.0.11, and its main branch of 2026) gives a new
    communicator its context id in agreement rounds among its processes,
    one allocation at a time in each process: the allocation whose parent
    communicator has the lowest local id goes on, any other waits
    (``ompi_comm_cid_lowest_id`` in ``ompi/communicator/comm_cid.c``).  An
    allocation whose round fails (a constructor -- ``MPI_Comm_dup``,
    ``MPI_Comm_split``, ``MPI_Intercomm_merge`` -- whose peer died or whose
    communicator was revoked under it) returns its error without giving
    that turn back, so every later constructor over a parent of higher id
    waits for it forever, ``MPIX_Comm_shrink`` included: the survivors of
    a failure that interrupted a join spun in ``ompi_comm_nextcid`` inside
    their shrink until the campaign killed them (a hang of the kind
    open-mpi/ompi#13138 reports).  ``MPI_COMM_SELF``'s id (1) is below that of any
    communicator a program makes, so its allocation goes on, alone in this
    process, and on success gives the turn back.  Only ``MPI_COMM_WORLD``'s
    id (0) is lower: a constructor over the world itself that fails is not
    released (this package makes those at the start of a run only).

    Call it before a recovery's first constructor, with no other thread of
    this process constructing a communicator (the recovery has stopped the
    algorithm's threads): where no allocation is stuck it is one local
    duplicate, some microseconds."""
    MPI.COMM_SELF.Dup().Free()


def shrink(comm: MPI.Intracomm) -> MPI.Intracomm:
    """``MPIX_Comm_shrink(comm)``: the communicator of ``comm``'s processes
    alive now (ULFM; a process that dies during it is left out), tracked
    (:func:`track`), after :func:`release_context_ids` so that a
    constructor a failure ended earlier cannot hold it forever."""
    release_context_ids()
    # mpi4py's stub types Shrink as returning a Comm; an Intracomm's gives an Intracomm.
    return track(comm.Shrink())  # type: ignore[return-value]


# What failures left unfinished, kept to the end of the process (see hold).
_held: list[object] = []
_held_lock = threading.Lock()


def hold(*owners: object) -> None:
    """Keep ``owners`` alive to the end of the process: the requests of an
    operation that a failure ended before they completed, or an object a
    failure made this rank abandon that owns some (a progress thread's
    posted receives and sends, a vote in flight).

    Why: mpi4py frees a request that is garbage-collected while still
    active (``MPI_Request_free``), and Open MPI ends the whole job when a
    freed request's transfer later fails ("Send error after request freed",
    fatal on no communicator, whatever the error handlers say), as a
    transfer to a dead rank or on a revoked communicator does.  A held
    request completes or fails inside MPI with no one waiting, and its
    buffer stays valid (the request references it).  The cost is what one
    failure left in flight, once per failure."""
    with _held_lock:
        _held.extend(owners)


def waitall(requests: list[MPI.Request]) -> None:
    """``MPI_Waitall(requests)``; when it fails, the requests are
    :func:`hold`-ed before the error propagates, so that none left active
    is freed under a transfer that may still fail."""
    try:
        MPI.Request.Waitall(requests)
    except MPI.Exception:
        hold(list(requests))
        raise


def wait(request: MPI.Request) -> None:
    """``MPI_Wait(request)``, holding the request when it fails (:func:`waitall`)."""
    try:
        request.Wait()
    except MPI.Exception:
        hold(request)
        raise
