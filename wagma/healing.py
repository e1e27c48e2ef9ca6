"""Replacements that join a running job: spawned by the survivors, given the live state of a peer over MPI.

After ranks died and the survivors went on without them
(:func:`wagma.membership.survive`), the job can grow back: the survivors
call :func:`replace`, collectively, at a step they agree on (the one
``survive`` returned, or any later one), and each process it starts calls
:func:`join` in place of :func:`wagma.algorithms.create`.  What happens:

1. the survivors end the algorithm as it runs on them (:meth:`~wagma.algorithms.base.Algorithm.close`:
   threads, hooks and collectives drained), start ``count`` processes running ``command`` with
   ``MPI_Comm_spawn`` over their communicator (Open MPI's PRRTE places them
   on the job's hosts; under ``--with-ft ulfm`` a shrunk communicator
   spawns), and both sides merge the intercommunicator: the survivors
   first, in their order, then the newcomers, in the order spawned;
2. newcomer i takes row ``left[i]``, the i-th row (rank of the job's first
   communicator) that left and was not replaced yet, lowest first: that
   rank's place in the algorithm's order, its data shard and its row of
   the run file;
3. the survivors' rank 0 sends each newcomer, point to point, what a living
   rank holds: the algorithm's name, the options for the new rank count
   (the run's first options fitted to it: a group size lowered for fewer
   survivors is raised again where the ranks are back), the step, the
   membership (rows, changes), and its model, buffers, optimizer state and
   algorithm state.  No file: the state is the survivor's as it is now;
4. every member builds the algorithm on the merged communicator, the
   survivors by :meth:`~wagma.algorithms.base.Algorithm.rebuild`, the
   newcomers by constructing it: the same collective calls.  Where the
   algorithm keeps its replicas equal (``survivors_continue_from ==
   "source"``: Allreduce-SGD, eager-SGD) rank 0's model, buffers and
   optimizer state are every member's, bitwise, as after a shrink; the
   model-averaging algorithms keep each survivor's replica, and a newcomer
   starts from rank 0's, which the next average merges with the others.

Only a process of this job joins: before the two sides merge, each
process started proves the secret the launcher gave the job
(:mod:`collectives.admission`); where one does not, or does not answer in
time, none of them joins, and the change records it.  Nothing here listens
for processes that were started elsewhere: with the Open MPI wheel here,
``MPI_Comm_connect`` from a second ``mpiexec`` never reaches the job's
``MPI_Open_port`` (the two have no PMIx server in common), and a persistent
PRRTE (``prte`` with ``mpiexec --dvm``), which would give them one, ends in
a segmentation fault of ``mpiexec``.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import torch
from mpi4py import MPI

from collectives.admission import SECRET_VARIABLE, Verdict, admit, job_secret, present, receive_within
from collectives.comm import Communicator
from collectives.failures import every_one_done, hold, mpi_failure, revoke_tracked, shrink, track

from .membership import Membership, MembershipChange, Noticed, RecoveryAgreed, members_agree

if TYPE_CHECKING:
    from collections.abc import Sequence

    from collectives.spares import SparePool

    from .algorithms.base import Algorithm

__all__ = ["join", "replace"]

logger = logging.getLogger(__name__)

_TAG_STATE = 4242  # the survivors' rank 0 to each newcomer, on the merged communicator
#: The most seconds a newcomer waits for the state once admitted (a model of GBs over TCP included).
STATE_WAIT_S = 600.0
#: Whether this process joined a running job (:func:`join`).  With the
#: Open MPI 5.0.11 wheel a spawn over a communicator that holds such a
#: process fails: rooted at it, PRRTE answers "LAUNCHER JOB OBJECT NOT
#: FOUND"; rooted at a process of the first launch, the new process cannot
#: reach the first launch's ("host: unknown") and aborts the job.
_joined_a_job = False


def replace(
    algo: Algorithm,
    count: int,
    command: Sequence[str] | None = None,
    *,
    spares: SparePool | None = None,
    secret: str | None = None,
    wait_s: float = 60.0,
) -> MembershipChange:
    """Bring ``count`` processes into the job and rebuild ``algo`` with them
    (see the module docstring); collective over the algorithm's members.
    The processes are either started, ``count`` of ``command``
    (``[program, *args]``, each of which calls :func:`join`), or called
    from the job's ``spares`` (the next ones of the pool not known dead,
    each of which waits in :meth:`~collectives.spares.SparePool.wait` and
    then calls :func:`join` with the communicator it got): one of the two.

    Every process started must prove the job's ``secret`` (by default the
    launcher's, :func:`collectives.admission.job_secret`) within ``wait_s``
    seconds of the challenge (:func:`collectives.admission.admit`); where
    one does not, none joins: the members revoke the link to them, rebuild
    the algorithm among themselves and go on, and the change records the
    verdicts (``refused``).  Spares, ranks of the job's own world, prove
    nothing (:mod:`collectives.spares`).

    Returns:
        MembershipChange: the same on every member, with ``joined`` the
        rows the newcomers took and ``recovery_s`` the seconds from the
        spawn to the moment the last member was ready to go on.

    Raises:
        ValueError: on every member, before anything is started: neither or
            both of ``command`` and ``spares`` were given, ``count`` is not
            between 1 and the rows that left and were not replaced (with
            spares: none is left; fewer than ``count`` bring in as many),
            ``wait_s`` is not a positive
            number, or, to start processes: the job has no secret, or a
            member is itself a spawned replacement (with Open MPI 5.0.11 a
            second generation of spawned processes aborts the job;
            docs/healing.md).
    """
    membership = algo.membership
    if (command is None) == (spares is None):
        raise ValueError("replace takes either a command to start or the job's spares, not both, not neither")
    secret = secret or job_secret()
    if spares is None and not secret:
        raise ValueError(
            f"replace needs the job's secret: the launcher puts it in ${SECRET_VARIABLE} "
            "(python -m experiments.mpirun --fault-tolerant does), or pass secret="
        )
    if isinstance(wait_s, bool) or not isinstance(wait_s, (int, float)) or not wait_s > 0:
        raise ValueError(f"wait_s must be a positive number of seconds, got {wait_s!r}")
    # The members' agreement opens the change, as it opens a recovery (wagma.membership.members_agree):
    # where a member is recovering from a failure, every member joins it (RecoveryAgreed, which the
    # caller passes to wagma.membership.survive) and calls again on the survivors' communicator.
    # Members found dead without a shrink (ensemble_sync's coordinator, on rank 0, leaves them out of
    # its rounds, and the others need not know) leave the communicator first, so that no collective
    # below waits for them and their rows can be taken: the agreement says whether any member knows of
    # a dead one, and then a shrink leaves out every dead member.  A death no member has noticed yet
    # fails the allgather below on every member (it needs each one's part): they recover, as from any
    # failure (survive, by the caller), and call again on their communicator.
    members, rows = membership.comm, membership.original_ranks
    # What the members recover from where a failure ends the call: their communicator as it was before
    # it, the dead it shrinks out below included, so that the recovery's change records them as left.
    before = members, rows
    recovering, dead_known = members_agree(members, recovering=False, knows_dead=bool(algo.dead_ranks & set(rows)))
    if recovering:
        raise RecoveryAgreed()
    if dead_known:
        members = shrink(members)
    # With this member's row, and its view of the spares: those every member knows alive, in the pool's order.
    views = members.allgather((membership.original_rank, spares.available() if spares else [], _joined_a_job))
    rows = [view[0] for view in views]
    dead = sorted(set(membership.original_ranks) - set(rows))
    vacant = sorted({r for r in range(membership.rows) if r not in rows})
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= len(vacant):
        raise ValueError(f"count must be an int from 1 to {len(vacant)} (the rows left vacant), got {count!r}")
    alive_spares = [r for r in views[0][1] if all(r in view[1] for view in views)]
    if spares is not None and not alive_spares:
        raise ValueError("no spare is left (alive, to every member)")
    if spares is not None:
        count = min(count, len(alive_spares))  # as many as are left
    if spares is None and any(view[2] for view in views):
        raise ValueError(
            "a member is a replacement itself: with Open MPI 5.0.11 a process spawned from a communicator "
            "that holds a spawned one cannot reach the job's first processes ('host: unknown' in its TCP "
            "transport) and aborts the job, so replacements join once, while every member is of the first launch"
        )
    started = members.allreduce(time.time(), op=MPI.MIN)
    # The algorithm as it runs on the survivors ends first, as at the end of a run (its threads, hooks
    # and collectives drained: AD-PSGD's last exchanges land in the model), so that what the newcomers
    # receive is final and nothing of it runs beside the rebuilt one.
    algo.close()
    if dead:
        logger.warning("rows %s found dead leave before the replacements join", dead)
    membership.comm, membership.original_ranks = members, rows
    refused: list[Verdict] = []
    used = spares.used if spares is not None else 0
    if spares is not None:
        merged: MPI.Intracomm | None = spares.call(membership.comm, alive_spares[:count])  # puts them back if it fails
    else:  # a command and a secret, as checked above
        merged, refused = _start(membership.comm, count, command or [], secret or "", wait_s)
    joined = [] if refused else vacant[:count]
    options, adjustments = _options_for(algo.name, membership.options, membership.comm.Get_size() + len(joined))
    how: Noticed = "spare" if spares is not None else "spawned"
    if merged is None:  # refused: the members go on among themselves
        algo.rebuild(Communicator(membership.comm), options, algo.steps, source=0)
        ready = membership.comm.allreduce(time.time(), op=MPI.MAX)
        return _joined(algo, started, ready, joined, adjustments, how, refused)
    rows = membership.original_ranks + joined
    failure = None
    try:
        if merged.Get_rank() == 0:
            state = {**_state_of(algo, rows, options), "joined": joined, "adjustments": adjustments, "started": started}
            for index, row in enumerate(joined):
                merged.send({**state, "row": row}, dest=len(membership.original_ranks) + index, tag=_TAG_STATE)
        membership.comm, membership.original_ranks = merged, rows
        algo.rebuild(Communicator(merged), options, algo.steps, source=0)
        ready = merged.allreduce(time.time(), op=MPI.MAX)
    except BaseException as error:
        failure = mpi_failure(error)
        if failure is None:
            raise
        logger.warning("a rank failed while rows %s were taken: %s", joined, error, exc_info=True)
        revoke_tracked()  # a member blocked on a peer that gave up is released
    if not every_one_done(merged, failure is None):
        # Nobody joins: the newcomers leave (join raises; a spare waits again, to be called first next
        # time), and the members' failure is recovered from their communicator before the call, as any
        # (wagma.membership.survive), by the caller.
        membership.comm, membership.original_ranks = before
        if spares is not None:
            spares.put_back(used)
        raise failure or MPI.Exception(MPI.ERR_PROC_FAILED)
    return _joined(algo, started, ready, joined, adjustments, how, refused)


def _start(
    members: MPI.Intracomm, count: int, command: Sequence[str], secret: str, wait_s: float
) -> tuple[MPI.Intracomm | None, list[Verdict]]:
    """Spawn ``count`` processes of ``command``, admit them on the job's
    secret and merge with them (the members first): returns the merged
    communicator and no verdicts, or None and the verdicts where one was
    not admitted (the link to them revoked)."""
    # Tracked: where a member dies from here on, the recovery (survive) revokes it, which releases
    # the newcomers from their wait for a verdict or for the state.
    inter = track(members.Spawn(command[0], list(command[1:]), maxprocs=count, root=0))
    verdicts = admit(inter, members, secret, wait_s)
    refused: list[Verdict] = [v for v in verdicts if v != "admitted"]
    if refused:
        inter.Revoke()  # a candidate still waiting for its verdict is released with an error
        hold(inter)  # revoked: let go without a collective free
        return None, refused
    merged: MPI.Intracomm = track(inter.Merge(high=False))
    inter.Free()
    return merged, []


def join(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    secret: str | None = None,
    spare: MPI.Intracomm | None = None,
) -> tuple[Algorithm, int]:
    """In a process :func:`replace` started (or, with ``spare``, a spare it
    called, on the communicator its wait returned): prove the job's
    ``secret`` (by default the one the launcher put in this process's
    environment; a spare proves nothing), merge with the survivors, take
    the state rank 0 sends (model, buffers, optimizer and algorithm state,
    step, membership) and build the algorithm with them.  ``model`` and
    ``optimizer`` must be built as every rank builds them (same
    architecture; the values are replaced).

    Returns:
        ``(algo, row)``: the algorithm, at the survivors' step, and the row
        this process took (its data shard, its row of the run file).

    Raises:
        RuntimeError: this process was not started by :func:`replace`.
        PermissionError: the job refused this process (its secret did not
            match) or gave up on it (its members failed on the way, or said
            nothing in time); the state it may have received is dropped
            (the algorithm built with it abandoned).  A spare goes back to
            :meth:`~collectives.spares.SparePool.wait`: the members call it
            first next time.
    """
    from .algorithms import ALGORITHMS

    merged = spare if spare is not None else _merge_with_parent(secret or job_secret())
    failure: BaseException | None = None
    algo: Algorithm | None = None
    try:
        state = receive_within(merged, 0, _TAG_STATE, STATE_WAIT_S)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        comm = Communicator(merged)
        # The class itself, as the survivors' rebuild constructs it again: the same collective calls.
        algo = ALGORITHMS[state["algorithm"]](model, optimizer, comm, init_sync=False, **state["options"])
        algo.adopt_source(0)
        algo.load_state_dict(state["algorithm_state"])
        algo.membership = Membership(
            merged, state["rows"], list(state["changes"]), rows=state["first_rows"], options=state["first_options"]
        )
        algo.own_communicator(comm)
        ready = merged.allreduce(time.time(), op=MPI.MAX)
    except (MPI.Exception, TimeoutError) as error:  # a member failed on the way
        if isinstance(error, MPI.Exception) and mpi_failure(error) is None:
            raise
        failure = error
        revoke_tracked()
    agreed = every_one_done(merged, failure is None)  # on every process: built wherever agreed
    if not agreed or algo is None:
        if algo is not None:  # its threads stopped, without communicating: a spare waits again
            algo.abandon()
        raise PermissionError(f"the job gave up on this process: a rank failed while it joined ({failure or 'a peer'})")
    how: Noticed = "spare" if spare is not None else "spawned"
    _joined(algo, state["started"], ready, state["joined"], state["adjustments"], how)
    return algo, state["row"]


def _merge_with_parent(secret: str | None) -> MPI.Intracomm:
    """A spawned process's side of :func:`_start`: prove ``secret``, merge (last)."""
    parent = MPI.Comm.Get_parent()
    if parent == MPI.COMM_NULL:
        raise RuntimeError("join: this process was not spawned by the survivors of a job (wagma.healing.replace)")
    global _joined_a_job
    present(parent, secret)
    _joined_a_job = True
    merged: MPI.Intracomm = track(parent.Merge(high=True))
    parent.Free()
    return merged


def _options_for(name: str, first: dict[str, Any], ranks: int) -> tuple[dict[str, Any], list[str]]:
    from .options.fit import fit_options

    return fit_options(name, dict(first), ranks)


def _state_of(algo: Algorithm, rows: list[int], options: dict[str, Any]) -> dict[str, Any]:
    """What the survivors' rank 0 hands a newcomer (tensors on the CPU)."""
    with algo.lock:  # the model and what the algorithm holds for it, at one moment
        model = {k: v.detach().cpu().clone() for k, v in algo.model.state_dict().items()}
        state = {
            "algorithm": algo.name,
            "options": options,
            "rows": rows,
            "changes": list(algo.membership.changes),
            "first_rows": algo.membership.rows,
            "first_options": algo.membership.options,
            "model": model,
            "optimizer": algo.optimizer.state_dict(),
            # Its counters, for the options the newcomer runs with (those of the new rank count).
            "algorithm_state": {**algo.state_dict(), "options": options},
        }
    return state


def _joined(algo, started, ready, joined, adjustments, noticed, refused=()):
    """The change every member records once the algorithm is rebuilt
    (``started``: the members' start, ``ready``: the last one ready; the
    same on every member)."""
    comm = algo.membership.comm
    change = MembershipChange(
        step=algo.steps,
        left=[],
        joined=list(joined),
        noticed=noticed,
        where="between steps",
        noticed_at=started,
        recovery_s=ready - started,
        ranks_after=comm.Get_size(),
        adjustments=list(adjustments),
        refused=list(refused),
    )
    algo.membership.changes.append(change)
    return change
