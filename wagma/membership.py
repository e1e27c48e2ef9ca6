"""What the survivors of a dead rank do: revoke, shrink, agree on a step and a model, rebuild the algorithm.

Under MPI fault tolerance (Open MPI's ULFM, :func:`collectives.failures.fault_tolerant`)
a rank that dies does not end the job: the operations that need it fail
with ``MPI_ERR_PROC_FAILED`` on the ranks that wait for it.  A rank that
sees such an error, anywhere (a collective of the step, a progress or
communication thread, an evaluation between steps), calls :func:`survive`,
which

1. revokes every communicator this process's collectives made
   (:func:`collectives.failures.revoke_tracked`), so that every other rank's
   pending or next operation fails too (``MPI_ERR_REVOKED``) and it joins
   the recovery instead of waiting for a peer that will never answer;
2. stops the algorithm's threads and drops its communicators, locally
   (:meth:`~wagma.algorithms.base.Algorithm.abandon`), and puts back the
   model this rank had before the step that failed where that step had
   begun to change it;
3. joins the members' agreement (:func:`members_agree`, ``MPIX_Comm_agree``)
   on the algorithm's communicator, saying it recovers, then shrinks that
   communicator to the survivors (``MPI_Comm_shrink``, fault tolerant) and
   learns who left;
4. agrees, in one allgather over the survivors, on the step to go on from
   (the furthest any survivor completed: a survivor behind it skips to it,
   as ensemble_sync's late ranks do) and on the options for the smaller
   rank count (:func:`wagma.options.fit.fit_options`: the options as they
   are where they fit; one that no longer does, a group size above the
   survivors, is adjusted by a stated rule, recorded in the change's
   ``adjustments``; what no rule mends is refused on every survivor with a
   message that names it);
5. rebuilds the algorithm on the survivors (groups, rings, neighbours,
   buckets, partial collectives, progress threads, StragglAR plans:
   everything that depends on P is built anew, as at construction), and
6. makes the survivors' models what the algorithm says they continue from
   (:attr:`~wagma.algorithms.base.Algorithm.survivors_continue_from`):

   * ``"source"`` (Allreduce-SGD, eager-SGD: gradient averaging keeps the
     replicas equal): every survivor takes the model, buffers and optimizer
     state of the survivor that completed the most steps (the lowest rank
     among them).  Replicas were equal after the last completed step, so
     this is the last completed average, and the survivors stay bitwise
     equal.
   * ``"own"`` (every model-averaging algorithm): each survivor keeps its
     own replica as of its last completed step.  Their replicas differ by
     design (only their average is the model), the next average merges
     them, and no survivor's progress since the last average is thrown
     away; what is lost is the dead rank's replica.

A failure during the recovery itself (another rank dies) starts it again
on the communicator it reached, from the agreement.  A new failure counts
as a new membership change.

**Why an agreement first.**  Survivors do not notice a death at the same
point of their programs: one that shared a group with the dead rank fails
at once, one that did not may reach a membership change of its own first
(:func:`wagma.healing.replace`, which starts with the same agreement).  Two
members that entered different collectives on one communicator, a shrink
here and an agreement there, an allgather of the recovery there and one of
the replacement here, match each other's messages: under Open MPI 5.0.11 a
replacement's allgather received a recovery's rows (``'>' not supported
between instances of 'int' and 'list'``), about 1 job in 15 of
``tests/test_healing.py``'s AD-PSGD case, whose survivors can go five steps
without meeting the dead rank.  Every change on the members' communicator
therefore opens with this one agreement, and its answer, the same on every
member, says whether any member recovers: then all do, the members that
came to replace included, and they go through the same collectives.

Where there is no fault tolerance the launcher ends the job when a rank
dies; nothing here runs.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from mpi4py import MPI

from collectives.comm import Communicator
from collectives.failures import FAILURE_CLASSES, fault_tolerant, mpi_failure, revoke_tracked, shrink

if TYPE_CHECKING:
    from .algorithms.base import Algorithm

__all__ = ["Membership", "MembershipChange", "Noticed", "Where", "survive"]

logger = logging.getLogger(__name__)

#: How a rank learned of the failure, ``proc_failed`` (an operation that
#: needed the dead rank failed), ``request_failed`` (a multiple completion,
#: ``MPI_Waitall``, one of whose transfers failed) or ``revoked`` (a
#: survivor revoked a communicator it was using); a change that brought
#: replacements in (:func:`wagma.healing.replace`) is ``spawned`` (started
#: for it) or ``spare`` (called from the job's spares).
Noticed = Literal["proc_failed", "request_failed", "revoked", "spawned", "spare"]
#: Where the first survivor to notice was, ``step`` (the training step's
#: collectives, or the backward hooks' communication), ``thread`` (a
#: progress or communication thread, which hands it to the main thread at
#: its next wait) or ``between steps`` (evaluation, the stop vote, a
#: checkpoint, ``close()``).
Where = Literal["step", "thread", "between steps"]


@dataclass
class MembershipChange:
    """One change of the members (a shrink to the survivors, or replacements joining), the same on every member."""

    #: The step the survivors go on from (the furthest any of them completed).
    step: int
    #: The ranks that left, as ranks of the job's first communicator (the run file's row numbers).
    left: list[int]
    #: How the first survivor to notice learned of it.
    noticed: Noticed
    #: Where that survivor was.
    where: Where
    #: That survivor's wall-clock time of noticing (``time.time()``).
    noticed_at: float
    #: Seconds from that moment to the moment the last survivor was ready to go on.
    recovery_s: float
    #: The survivors.
    ranks_after: int
    #: Options changed for the new rank count, in words.
    adjustments: list[str] = field(default_factory=list)
    #: The rows replacements took (:mod:`wagma.healing`), as ranks of the job's first communicator.
    joined: list[int] = field(default_factory=list)
    #: Processes started as replacements and not admitted, by verdict
    #: (``refused``: no proof of the job's secret; ``late``: no answer in
    #: time; :mod:`collectives.admission`); none of that attempt joined.
    refused: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Membership:
    """Who an algorithm runs on now, and how that came to be."""

    #: The communicator a recovery shrinks, over the current members (the
    #: algorithm's control channel at first, then the survivors'
    #: communicator of the last change); every member shrinks the same one.
    comm: MPI.Intracomm
    #: Each current member's rank in the communicator the algorithm was first built on, by current rank.
    original_ranks: list[int]
    #: Every change so far, in order.
    changes: list[MembershipChange] = field(default_factory=list)
    #: The ranks of the first communicator (where none is given, as many as ``original_ranks``).
    rows: int = 0
    #: The algorithm's options on the first communicator, which a job
    #: that grows back (:mod:`wagma.healing`) fits to its new rank count.
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rows = self.rows or len(self.original_ranks)

    @property
    def original_rank(self) -> int:
        """This rank's rank in the communicator the algorithm was first built on."""
        return self.original_ranks[self.comm.Get_rank()]

    @property
    def left(self) -> list[int]:
        """Every rank of the first communicator that has left and not been
        replaced (:mod:`wagma.healing`)."""
        return sorted({r for change in self.changes for r in change.left} - set(self.original_ranks))


#: :func:`members_agree`'s bits: the member is not recovering from a failure,
#: and it knows of no dead member of the communicator.
_HEALTHY, _NONE_DEAD = 1, 2


class RecoveryAgreed(MPI.Exception):
    """The members agreed that one of them recovers from a failure
    (:func:`members_agree`): raised by a membership change that met the
    recovery's agreement; :func:`survive` then shrinks at once, its
    agreement done.  Of class ``MPI_ERR_PROC_FAILED``."""

    def __init__(self) -> None:
        super().__init__(MPI.ERR_PROC_FAILED)


def members_agree(comm: MPI.Intracomm, recovering: bool, knows_dead: bool = False) -> tuple[bool, bool]:
    """The agreement every membership change on the members' communicator
    ``comm`` opens with (``MPIX_Comm_agree``, the same answer on every live
    member): ``(any member recovers, any member knows of a dead one)``.

    A member that recovers (:func:`survive`) says so; one that changes the
    membership otherwise (:func:`wagma.healing.replace`) says whether it
    knows of a dead member.  Where the agreement reports a failure instead
    (a member died and not every member had acknowledged it, as where
    ensemble_sync's coordinator alone knows a member dead), the answer is
    lost in mpi4py's exception; the error is the same on every member, and
    after it every member acknowledges the processes that did not
    contribute (``MPI_Comm_ack_failed``), so the agreement asked again
    answers (the ULFM man page of ``MPIX_Comm_agree``), each member now
    saying that it knows of a dead one.  A death during it starts it once
    more; any other error is raised."""
    flags = 0 if recovering else _HEALTHY | (0 if knows_dead else _NONE_DEAD)
    while True:
        try:
            agreed = comm.Agree(flags)
            break
        except MPI.Exception as error:
            if error.Get_error_class() not in FAILURE_CLASSES:
                raise
            comm.Ack_failed()
            flags &= ~_NONE_DEAD  # the agreement found a member dead: every member knows it now
    return not agreed & _HEALTHY, not agreed & _NONE_DEAD


def survive(algo: Algorithm, error: BaseException, where: Where) -> MembershipChange:
    """Carry ``algo`` over to the survivors of the failure behind ``error``
    (see the module docstring); collective over the survivors, every one of
    which must call it (each does once an operation of its fails).

    ``error`` itself is raised again when it is not a rank's failure, or
    when the job has no fault tolerance (nothing can be recovered).

    Returns:
        The change, the same on every survivor; ``algo`` is then rebuilt on
        them (:attr:`~wagma.algorithms.base.Algorithm.membership` holds the
        survivors' communicator, and the ranks they had at the start).
    """
    failure = mpi_failure(error)
    if failure is None or not fault_tolerant():
        raise error
    noticed_at = time.time()
    kind = failure.Get_error_class()
    noticed: Noticed = (  # MPI_ERR_OTHER: a communicator constructor's, whose peer died (collectives.failures)
        "proc_failed"
        if kind in FAILURE_CLASSES or kind == MPI.ERR_OTHER
        else "revoked"
        if kind == MPI.ERR_REVOKED
        else "request_failed"
    )
    if where == "step" and failure is not error:
        where = "thread"
    revoke_tracked()
    algo.abandon()
    comm = algo.membership.comm
    agreed = isinstance(error, RecoveryAgreed)
    while True:
        if not agreed:
            members_agree(comm, recovering=True)
        agreed = False
        survivors = shrink(comm)
        try:
            return _rebuild(algo, survivors, noticed, where, noticed_at)
        except BaseException as again:
            if mpi_failure(again) is None:
                raise
            logger.warning("another rank failed while the survivors recovered: %s", again)
            revoke_tracked()
            algo.abandon()
            comm = survivors


def _rebuild(algo, survivors, noticed, where, noticed_at):
    """Steps 4 to 6 of the module docstring on the shrunk ``survivors``."""
    from .options.fit import fit_options

    membership = algo.membership
    mine = (membership.original_rank, algo.steps, noticed_at, noticed, where)
    table = survivors.allgather(mine)
    originals = [row[0] for row in table]
    left = sorted(set(membership.original_ranks) - set(originals))
    resume = max(row[1] for row in table)
    source = next(r for r, row in enumerate(table) if row[1] == resume)
    first = min(range(len(table)), key=lambda r: table[r][2])
    options, adjustments = fit_options(algo.name, dict(algo.options), survivors.Get_size())
    membership.comm, membership.original_ranks = survivors, originals
    algo.rebuild(Communicator(survivors), options, resume, source)
    ready = survivors.allreduce(time.time(), op=MPI.MAX)
    change = MembershipChange(
        step=resume,
        left=left,
        noticed=table[first][3],
        where=table[first][4],
        noticed_at=table[first][2],
        recovery_s=ready - table[first][2],
        ranks_after=survivors.Get_size(),
        adjustments=adjustments,
    )
    algo.membership.changes.append(change)
    logger.warning(
        "ranks %s left at step %d (%s, %s); %d survivors go on from step %d after %.2f s%s",
        left,
        resume,
        change.noticed,
        change.where,
        change.ranks_after,
        resume,
        change.recovery_s,
        f" ({'; '.join(adjustments)})" if adjustments else "",
    )
    return change
