"""The wait-avoiding group allreduce of WAGMA-SGD (section 3.1) and eager-SGD's partial collectives."""

from __future__ import annotations

import atexit
import os
from dataclasses import dataclass
from functools import partial
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Literal, get_args

import numpy as np
from mpi4py import MPI

from ..agreement import agree
from ..backoff import Backoff
from ..buffers import LikeT, describe
from ..comm import Communicator, node_oversubscribed
from ..compression import CompressionName, Compressor, compressed_allreduce, compressed_group_schedule, compressor_for
from ..failures import hold
from ..schedules.blocking import Op, allreduce, reduction_problem
from .activation import RandomActivators
from .group_allreduce import GROUP_ALLREDUCE_CHOICES, GroupAllreduceAlgorithm, group_communicators, group_schedule
from .groups import ButterflyGrouping, GroupPlan
from .progress import IDLE_POLICIES, Idle, ProgressEngine

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self is Python 3.11's

__all__ = [
    "ACTIVATIONS",
    "Activation",
    "GroupResult",
    "IDLE_CHOICES",
    "IDLE_ENV",
    "IdleChoice",
    "LATE",
    "Late",
    "WAITS",
    "Waits",
    "WaitAvoidingGroupAllreduce",
    "majority_allreduce",
    "resolve_idle",
    "resolve_waits",
    "solo_allreduce",
]

#: Who activates a version.
#: ``"first"``: the first rank to arrive (WAGMA; with group_size = P,
#: eager-SGD's solo collective).  ``"random"``: one rank
#: drawn per version from a seeded sequence, the same on every rank
#: (:class:`~collectives.wait_avoiding.activation.RandomActivators`; eager-SGD's majority
#: collective as its reference code implements it).  ``"half"``: the leader of
#: version v (rank v mod P) once ceil(P/2) ranks have arrived (the WAGMA
#: paper's description of eager-SGD, section 2.2: "allowing at most half
#: processors to contribute stale gradients").
Activation = Literal["first", "random", "half"]
#: The values of :data:`Activation`, in its order.
ACTIVATIONS: tuple[Activation, ...] = get_args(Activation)

#: What becomes of a late contribution, one published after its version
#: began, when contributions are consumed (gradients): ``"drop"`` (it is
#: discarded), ``"newest"`` (it enters the next version unless a newer one
#: replaces it first), ``"accumulate"`` (it enters the next version, summed
#: with every later one that version has not read yet).
Late = Literal["drop", "newest", "accumulate"]
#: The values of :data:`Late`, in its order.
LATE: tuple[Late, ...] = get_args(Late)

#: How the executions the main thread waits for wait for their transfers:
#: ``"spin"`` in ``MPI_Waitall`` (a core per rank), ``"yield"`` testing with a
#: back-off (more ranks than cores: a spinning rank takes the core a passive
#: partner's progress thread needs), ``"auto"`` by
#: :func:`~collectives.comm.node_oversubscribed`.
Waits = Literal["auto", "spin", "yield"]
#: The values of :data:`Waits`, in its order.
WAITS: tuple[Waits, ...] = get_args(Waits)


#: The ways an idle progress thread may wait, ``idle=``.  ``"backoff"``
#: sleeps, leaving the cores to compute; ``"park"`` waits in MPI, noticing
#: an activation at once, with a core per rank for it; ``"auto"`` takes
#: ``$COLLECTIVES_PROGRESS_IDLE`` if set, else parks where the node has two
#: cores per rank (:func:`~collectives.comm.node_oversubscribed`) and the job
#: is not fault-tolerant, else backs off (:func:`resolve_idle`).
IdleChoice = Literal["auto", "backoff", "park"]
#: The values of :data:`IdleChoice`, in its order.
IDLE_CHOICES: tuple[IdleChoice, ...] = get_args(IdleChoice)
#: The environment variable that sets ``idle="auto"``'s choice.
IDLE_ENV = "COLLECTIVES_PROGRESS_IDLE"


def resolve_idle(idle: IdleChoice, comm: MPI.Intracomm, fault_tolerant: bool) -> Idle:
    """``"backoff"`` or ``"park"``: ``idle`` itself, or what ``"auto"``
    calls for (collective over ``comm`` then).  Under MPI fault tolerance
    ``"auto"`` never parks: a receive posted for any source would end with
    the first failure, where the back-off's probes report it at the next
    poll like every other call."""
    if idle != "auto":
        return idle
    given = os.environ.get(IDLE_ENV)
    if given in IDLE_POLICIES:
        return given
    oversubscribed = node_oversubscribed(comm, threads_per_rank=2)
    return "backoff" if oversubscribed or fault_tolerant else "park"


def resolve_waits(waits: Waits, comm: MPI.Intracomm) -> Literal["spin", "yield"]:
    """``"spin"`` or ``"yield"``: ``waits`` itself, or for ``"auto"`` what
    :func:`~collectives.comm.node_oversubscribed` calls for (collective over
    ``comm`` then)."""
    if waits != "auto":
        return waits
    return "yield" if node_oversubscribed(comm) else "spin"


@dataclass(frozen=True)
class GroupResult(Generic[LikeT]):
    """The outcome of one wait-avoiding group allreduce on one rank."""

    #: The group's sum (``op="sum"``) or mean (``op="avg"``) of
    #: version ``version``, in a buffer the caller owns from now on
    #: (never the one it passed, which the collective keeps: see
    #: :meth:`WaitAvoidingGroupAllreduce.allreduce`).
    value: LikeT
    #: The iteration t.
    version: int
    #: Whether this rank's own contribution was its iteration-t
    #: contribution (it arrived before version t began here).
    fresh: bool
    #: The iteration of the contribution this rank
    #: gave (t when fresh, older when stale, -1 for the initial one;
    #: under a ``late`` reading, the newest iteration it gave, and -1
    #: for zeros: nothing left to give).
    contribution_iteration: int
    #: The ranks of this rank's group of version t, whose contributions
    #: ``value`` sums (the divisor of ``op="avg"``): S for powers of two,
    #: between S and 2S otherwise
    #: (:class:`~collectives.wait_avoiding.groups.ButterflyGrouping`).
    group_size: int


class WaitAvoidingGroupAllreduce(Generic[LikeT]):
    """Group allreduce that no rank waits for a slower rank to enter.

    Semantics (WAGMA-SGD, Li et al., IEEE TPDS 2021, section 3.1 and
    Algorithm 2).  Iteration t is a *group version* unless
    ``(t + 1) mod tau == 0``, which makes it a *sync step*.  Every rank
    executes every group version exactly once and in order, in the butterfly
    group of iteration t (:class:`~collectives.wait_avoiding.groups.ButterflyGrouping`,
    for any P: S ranks for powers of two, between S and 2S otherwise; of
    iteration 0 at every t with ``dynamic_groups=False``), either *actively*
    (its main thread reached t first: it publishes its iteration-t
    contribution and activates t along its binomial tree) or
    *passively* (an activation for t, or a later version, arrived first: its
    progress thread executes t with the contribution it last published, even
    while its main thread still computes an older iteration).  The main
    thread at t gets the group sum (or mean), the group's size S_t, and
    whether its own contribution was fresh (WAGMA: W_{t+1} = sum / S_t) or
    stale (W_{t+1} = (sum + W'_t) / (S_t + 1)).
    Sync steps are blocking allreduces over all P ranks on a communicator of
    their own, so they cannot match group messages still in flight.

    Other activations (:data:`ACTIVATIONS`): ``"random"`` lets only one
    rank per version, drawn from a seeded sequence the same on every rank,
    activate it; ``"half"`` activates a version once ceil(P/2) main threads
    have reached it.  With ``group_size=P`` these are eager-SGD's
    collectives (:func:`solo_allreduce`, :func:`majority_allreduce`).

    ``late`` (eager-SGD's gradients; one of :data:`LATE`, None for WAGMA's
    models): contributions are consumed.  The first version executed here
    after a publication reads it; a version that begins before the next
    publication (this rank is late) reads zeros; and a contribution
    published after its own version began is dropped (``"drop"``), or read
    by the next version unless a newer one replaces it first
    (``"newest"``), or added into the next one (``"accumulate"``: a late
    rank's gradient arrives one or more versions late but is never lost nor
    counted twice).  Sync steps then reduce the fresh contributions of all
    P ranks (after the same settling) and publish nothing.  Without it,
    every version reads the last contribution published, however often,
    and a sync step publishes its result.

    Lifecycle: configure (no MPI) -> :meth:`open` (collective: duplicates the
    communicator, agrees on the arguments, starts the progress thread) ->
    one :meth:`allreduce` or :meth:`sync_allreduce` per iteration, in order ->
    :meth:`close` (collective: waits until no activation is in flight on any
    rank, joins the thread, checks that no message is left unmatched).  A
    ``with`` block opens and closes.

    Buffers are lent, not copied.  Later passive versions need W'_t after
    the main thread has moved on, so W'_t must outlive the call.  The
    paper's implementation copies the model into a send buffer every
    iteration (section 3.1: "the data in the send buffer of P1 is updated
    by W'_t"); here the caller's buffer *is* the send buffer: :meth:`allreduce`
    keeps it as the published contribution and writes the group sum into
    another buffer, ``value``, which becomes the caller's (double buffering:
    the model and the published contribution trade places every
    iteration).  The first phase of the schedule sends from the
    contribution, receives the partner's part straight into ``value`` and
    adds the contribution's part there, so the fresh path costs the blocking
    group allreduce's memory traffic and no copy, and is executed by the
    main thread itself (no hand-over to the progress thread), spinning like
    the blocking version or, on an oversubscribed node, yielding
    (``waits``).  Memory: the caller's buffer and the
    published one, plus one per stale result the main thread has not
    reached yet (a rank lagging k versions holds k; ``tau`` bounds k).

    Args:
        comm: the MPI communicator (any number of ranks P); MPI must provide
            ``MPI_THREAD_MULTIPLE``.
        like: the initial contribution (the initial model W_0, published as
            iteration -1) and the template of every buffer: a contiguous numpy
            array or torch tensor, the same size and dtype on every rank.
        group_size: S, an int with 1 <= S <= P (the groups' least size).
        tau: the period of sync steps (>= 1), or None for none.
        op: ``"sum"`` (the group sum) or ``"avg"`` (the group mean, scaled
            inside the schedule where it costs 1/S of a pass; divided by
            the size of the group, :attr:`GroupResult.group_size`).
        activation: one of :data:`ACTIVATIONS`.
        activator_seed: with ``activation="random"``, the seed of the
            activator sequence, an int >= 0 (the same on every rank).
        algorithm: the group allreduce, ``"recursive_doubling"``,
            ``"halving_doubling"``, ``"mpi"`` (the library's
            ``MPI_Allreduce`` on the group's communicator: faster for
            small buffers, in the library's order of additions, which
            :mod:`wagma.emulate` cannot replay) or ``"auto"`` (the
            butterfly by size,
            :func:`~collectives.wait_avoiding.group_allreduce.choose_group_allreduce`).
            Versions run the library from either thread, one at a time and
            in order, so every member calls it on a group's communicator
            in the same order.
        history: keep the last ``history`` ``(version,
            contribution_iteration)`` pairs executed on this rank in
            :attr:`history`, for tests and staleness statistics.
        first_iteration: the first iteration t to be called (a resumed run's
            step counter); ``like`` is published as iteration
            ``first_iteration - 1``.
        waits: one of :data:`WAITS`; :attr:`waits_used` says what ``"auto"``
            chose (set by :meth:`open`).
        idle: one of :data:`IDLE_CHOICES`: how the progress thread waits
            when it has nothing to do; :attr:`idle_used` says what
            ``"auto"`` chose (set by :meth:`open`).
        compression: ``"none"``, or ``"bf16"``, ``"fp16"``, ``"int8"`` for a
            float32 buffer: every version's group allreduce and every sync
            step's allreduce are compressed
            (:mod:`collectives.compression`: each contribution encoded once,
            float32 sums, int8 with error feedback; ``algorithm`` is then
            unused), on the groups' communicators as ``"mpi"`` runs.
        late: None, or one of :data:`LATE`: consume contributions (above).
            With ``"accumulate"`` the caller's buffer receives the unconsumed
            contribution it carries (``buf += carried`` in :meth:`allreduce`
            and :meth:`sync_allreduce`), and :meth:`unconsumed` gives what is
            left at the end.
        dynamic_groups: Algorithm 1's groups, which change with the version
            (default); False: every version averages in iteration 0's groups
            (the same hypercube dimensions; activations still travel
            over all P ranks).  That is WAGMA's ablation 2 (section 5.2,
            experiment 2: "the groups are fixed"; ResNet-50's top-1
            accuracy "drops to 72.2%"): with 1 < S < P an update leaves its
            group only at the sync steps.

    Example::

        wa = WaitAvoidingGroupAllreduce(MPI.COMM_WORLD, model, group_size=4,
                                        tau=10, op="avg")
        with wa:
            for t in range(steps):
                train_step(model)                  # W'_t in model
                if wa.is_group_version(t):
                    r = wa.allreduce(model, t)     # model is lent from here on
                    if not r.fresh:                # Algorithm 2, line 13
                        s = r.group_size           # S, or S to 2S off powers of two
                        r.value *= s / (s + 1)
                        r.value += model / (s + 1)
                    model = r.value                # W_{t+1}
                else:
                    wa.sync_allreduce(model, t, op="avg")
    """

    def __init__(
        self,
        comm: MPI.Intracomm,
        like: LikeT,
        *,
        group_size: int,
        tau: int | None = None,
        op: Op = "sum",
        activation: Activation = "first",
        activator_seed: int = 0,
        algorithm: GroupAllreduceAlgorithm = "auto",
        history: int = 0,
        first_iteration: int = 0,
        waits: Waits = "auto",
        dynamic_groups: bool = True,
        late: Late | None = None,
        idle: IdleChoice = "auto",
        compression: CompressionName = "none",
    ) -> None:
        self._raw = comm
        self._like: LikeT = like
        self.first_iteration = first_iteration
        self.group_size, self.tau, self.op = group_size, tau, op
        self.activation, self.algorithm = activation, algorithm
        self.activator_seed = activator_seed
        self._activators = RandomActivators(activator_seed, comm.Get_size())
        self.waits = waits
        self.dynamic_groups = dynamic_groups
        self.late = late
        self.idle = idle
        self.compression = compression
        #: The compressed streams (:class:`~collectives.compression.allreduce.Compressor`)
        #: of the group versions and of the sync steps, made by :meth:`open`
        #: with ``compression`` (None without): their residuals and bytes.
        self.compressor: Compressor | None = None
        self.sync_compressor: Compressor | None = None
        #: How the progress thread waits when idle, ``"backoff"`` or
        #: ``"park"`` (``idle``, or what ``"auto"`` chose; None until :meth:`open`).
        self.idle_used: Idle | None = None
        #: The waits in use, ``"spin"`` or ``"yield"`` (``waits``, or what
        #: ``"auto"`` chose; None until :meth:`open`).
        self.waits_used: Literal["spin", "yield"] | None = None
        self._history = history
        self._like_info = describe(like)
        self._problem = self._check_arguments(comm.Get_size())
        self._state = "new"
        self._main: Communicator | None = None
        self._progress: Communicator | None = None
        self._engine: ProgressEngine[LikeT] | None = None

    def _check_arguments(self, world_size):
        """``(message, exception type)`` for the first bad argument, or None."""
        info = self._like_info
        if info.problem:
            return info.problem, info.error
        if not isinstance(self.dynamic_groups, bool):
            return f"dynamic_groups must be True or False, got {self.dynamic_groups!r}", TypeError
        try:
            self.grouping = ButterflyGrouping(world_size, self.group_size, self.dynamic_groups)
        except (TypeError, ValueError) as exc:
            return str(exc), type(exc)
        if self.tau is not None and (isinstance(self.tau, bool) or not isinstance(self.tau, int) or self.tau < 1):
            return f"tau must be an int >= 1 or None, got {self.tau!r}", ValueError
        if self.late is not None and self.late not in LATE:
            return (f"late must be None or one of {', '.join(map(repr, LATE))}, got {self.late!r}"), ValueError
        problem = reduction_problem(info, self.algorithm, (*GROUP_ALLREDUCE_CHOICES, "auto"), self.op)
        if problem:
            return problem, ValueError
        if self.compression not in get_args(CompressionName):
            choices = ", ".join(map(repr, get_args(CompressionName)))
            return f"compression must be one of {choices}, got {self.compression!r}", ValueError
        if self.compression != "none" and info.dtype != "float32":
            return f"compression {self.compression!r} needs a float32 buffer, got {info.dtype}", TypeError
        if self.activation not in ACTIVATIONS:
            return (
                f"activation must be one of {', '.join(map(repr, ACTIVATIONS))}, got {self.activation!r}"
            ), ValueError
        if isinstance(self.activator_seed, bool) or not isinstance(self.activator_seed, int) or self.activator_seed < 0:
            return f"activator_seed must be an int >= 0, got {self.activator_seed!r}", ValueError
        if self.waits not in WAITS:
            return (f"waits must be one of {', '.join(map(repr, WAITS))}, got {self.waits!r}"), ValueError
        if self.idle not in IDLE_CHOICES:
            return (f"idle must be one of {', '.join(map(repr, IDLE_CHOICES))}, got {self.idle!r}"), ValueError
        given = os.environ.get(IDLE_ENV)
        if self.idle == "auto" and given and given not in IDLE_POLICIES:
            return (
                f"{IDLE_ENV} must be one of {', '.join(map(repr, IDLE_POLICIES))} or unset, got {given!r}"
            ), ValueError
        if not isinstance(self._history, int) or self._history < 0:
            return f"history must be an int >= 0, got {self._history!r}", ValueError
        if (
            isinstance(self.first_iteration, bool)
            or not isinstance(self.first_iteration, int)
            or self.first_iteration < 0
        ):
            return (f"first_iteration must be an int >= 0, got {self.first_iteration!r}"), ValueError
        return None

    def is_group_version(self, t: int) -> bool:
        """Whether iteration t is a group version (else a sync step)."""
        return self.tau is None or (t + 1) % self.tau != 0

    def _plan(self, t: int) -> GroupPlan:
        """This rank's part in version t's group allreduce (the groups repeat
        every :attr:`~collectives.wait_avoiding.groups.ButterflyGrouping.period`
        iterations: computed once per iteration of a period)."""
        return self._plans[t % len(self._plans)]

    # -- lifecycle ------------------------------------------------------------

    def open(self) -> "Self":
        """Duplicate the communicator, agree on the arguments, start the thread.

        Collective.  Raises on every rank, before any activation or data
        message, if any rank's arguments are bad or differ across ranks.
        """
        if self._state != "new":
            raise RuntimeError(f"open() on a {self._state} WaitAvoidingGroupAllreduce")
        self._main = Communicator(self._raw, thread_level=MPI.THREAD_MULTIPLE)
        problem, error = self._problem or (None, ValueError)
        info = self._like_info
        try:
            agree(
                self._main,
                "WaitAvoidingGroupAllreduce",
                problem,
                error,
                numel=info.numel,
                dtype=info.dtype,
                group_size=self.group_size,
                tau=self.tau,
                op=self.op,
                activation=self.activation,
                activator_seed=self.activator_seed,
                algorithm=self.algorithm,
                first_iteration=self.first_iteration,
                waits=self.waits,
                dynamic_groups=self.dynamic_groups,
                late=self.late,
                compression=self.compression,
            )
        except (TypeError, ValueError):
            self._main.close()
            self._state = "closed"
            raise
        self.waits_used = resolve_waits(self.waits, self._main.data)
        self.idle_used = resolve_idle(self.idle, self._main.data, self._main.fault_tolerant)
        self._t = self.first_iteration
        rank = self._main.rank
        self._plans = [self.grouping.plan(t, rank) for t in range(self.grouping.period)]
        if self.tau != 1:  # tau == 1: every step syncs, no group version to run
            self._progress = Communicator(self._raw, thread_level=MPI.THREAD_MULTIPLE, yield_while_waiting=True)
            self.compressor = compressor_for(self.compression, info.numel)
            schedule = (
                group_schedule(self.algorithm, self._progress, self.grouping, self._like.nbytes)
                if self.compressor is None
                else partial(
                    compressed_group_schedule, group_communicators(self._progress, self.grouping), self.compressor
                )
            )
            self._engine = ProgressEngine(
                self._progress,
                self._like,
                plan=self._plan,
                schedule=schedule,
                is_group_version=self.is_group_version,
                average=self.op == "avg",
                activation=self.activation,
                activator=self._activators,
                history=self._history,
                first_iteration=self.first_iteration,
                yield_awaited=self.waits_used == "yield",
                late=self.late,
                idle=self.idle_used,
            )
            self._engine.start()
            atexit.register(self._engine.halt)
        self._state = "open"
        return self

    def close(self) -> None:
        """Wait until no activation is in flight anywhere; stop and join the thread.

        Collective; every rank must have run the same iterations.
        Termination is detected by counting: progress threads send control
        messages only in reaction to ones they receive once the main threads
        are here, so when the totals of sent and received messages over all
        ranks are equal, and equal to the previous round's, none is in flight.
        """
        if self._state != "open":
            return
        assert self._main is not None  # opened
        self._state = "closing"
        agree(self._main, "WaitAvoidingGroupAllreduce.close", None, iterations_run=self._t)
        left = self._stop_engine() if self._engine else []
        self._main.close()
        self._state = "closed"
        if left:
            raise RuntimeError(
                f"rank {self._main.rank}: unmatched messages on the {' and '.join(left)} channel at close()"
            )

    def _stop_engine(self):
        """Quiesce, stop and join the progress thread; the channels with
        messages left unmatched."""
        engine = self._engine
        previous, backoff = None, Backoff(1e-3, 2e-2)
        while True:
            totals = np.array(engine.counts(), dtype=np.int64)
            self._main.control.Allreduce(MPI.IN_PLACE, totals, op=MPI.SUM)
            if totals[0] == totals[1] and np.array_equal(totals, previous):
                break
            previous = totals
            backoff.sleep()
        atexit.unregister(engine.halt)
        engine.stop()
        progress = self._progress
        left = [
            name
            for name, c in (("data", progress.data), ("control", progress.control))
            if c.iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)
        ]
        progress.close()
        return left

    def __enter__(self) -> "Self":
        return self.open() if self._state == "new" else self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.close()
            return
        # Leaving on an error: close() is collective and the other ranks may
        # never get there, so only stop this rank's thread and let the error
        # surface (under ``python -m mpi4py`` it aborts the job).
        self.abandon()

    def abandon(self) -> None:
        """Stop this rank's progress thread without communicating, and let
        go of the channels (not freed: after a failure they are revoked and
        peers may be gone).  For a rank that leaves on an error, or the
        survivors of a dead rank (:func:`collectives.failures.revoke_tracked`
        first, so that a thread blocked in MPI returns)."""
        if self._engine is not None:
            atexit.unregister(self._engine.halt)
            self._engine.halt(timeout=1.0)
            hold(self._engine)  # its posted receives and sends in flight: never freed under them
        self._state = "closed"

    # -- one call per iteration -------------------------------------------------

    def allreduce(self, buf: LikeT, t: int) -> GroupResult[LikeT]:
        """The group reduction of version t; ``buf`` holds W'_t and is lent.

        ``buf`` becomes this rank's published contribution: every version
        executed here from now on reads it until the next call (or sync
        step) publishes another, and then the collective reuses it (it may
        come back as a later ``value``).  So ``buf`` is the collective's from
        this call on: read it (line 13 of Algorithm 2 does), never write it.
        The result comes in another buffer, ``value``, which the caller owns
        from now on: the natural place for W_{t+1}, and the buffer to pass
        next time.  If version t has not begun here (fresh), this call
        activates it (if this rank is an activator of t) and executes it
        itself, waiting only for the communication of the group (and, if
        another rank activates t, for that).  If it has (stale), the
        reduction was made with an older contribution (or zeros).  With
        ``late="accumulate"`` the contribution still unconsumed from an
        earlier call is first added into ``buf``.

        Raises:
            ValueError: ``buf`` is a buffer this collective holds (the one
                published last time, or one it replaced and still uses).
        """
        self._expect(t, group=True, buffer=buf)
        assert self._engine is not None  # open, and with group versions (tau != 1)
        value, contribution_iteration = self._engine.arrive(buf, t)
        self._t = t + 1
        return GroupResult(value, t, contribution_iteration == t, contribution_iteration, self._plan(t).size)

    def sync_allreduce(self, buf: LikeT, t: int, op: Op = "sum") -> LikeT:
        """The blocking allreduce of a sync step over all P ranks, in place.

        Then publishes a copy of the result as this rank's contribution of
        iteration t (with ``op="avg"`` that is WAGMA's W_{t+1}); the caller
        keeps ``buf``.  One copy per tau iterations.  Under a ``late``
        reading nothing is published: ``buf`` first takes in (or drops) the
        unconsumed contribution as :meth:`allreduce` would, and later
        versions read zeros until the next call.
        """
        self._expect(t, group=False, buffer=buf)
        assert self._main is not None  # open
        if self.late is not None and self._engine:
            self._engine.consume_into(buf)
        if self.compression == "none":
            allreduce(buf, comm=self._main, op=op)
        else:
            if self.sync_compressor is None:
                self.sync_compressor = compressor_for(self.compression, self._like_info.numel)
            assert self.sync_compressor is not None  # compression is not "none"
            compressed_allreduce(buf, comm=self._main, compressor=self.sync_compressor, op=op)
        if self.late is not None:
            self._t = t + 1
            return buf
        return self._publish_sync(buf, t)

    def sync_reduced(self, buf: LikeT, t: int) -> LikeT:
        """A sync step whose reduction over all P ranks the caller has done
        (another schedule, e.g. StragglAR with a predicted straggler):
        ``buf`` holds the result, published like :meth:`sync_allreduce`'s."""
        self._expect(t, group=False, buffer=buf)
        return self._publish_sync(buf, t)

    def _publish_sync(self, buf: LikeT, t: int) -> LikeT:
        if self._engine:
            self._engine.publish_copy(buf, t)
        self._t = t + 1
        return buf

    def _expect(self, t: int, *, group: bool, buffer: LikeT) -> None:
        if self._state != "open":
            raise RuntimeError(f"WaitAvoidingGroupAllreduce is {self._state}; call open() (or use a with block) first")
        if t != self._t:
            raise ValueError(f"t must be the next iteration, {self._t}, got {t}")
        if self.is_group_version(t) != group:
            kind = "a group version" if self.is_group_version(t) else "a sync step"
            call = "allreduce" if self.is_group_version(t) else "sync_allreduce"
            raise ValueError(f"iteration {t} is {kind} (tau={self.tau}): call {call}()")
        info, like = describe(buffer), self._like_info
        if info.problem or (info.numel, info.dtype) != (like.numel, like.dtype):
            raise ValueError(
                f"buffer must be contiguous with {like.numel} elements "
                f"of {like.dtype} like the one given at construction, "
                f"got {info.problem or f'{info.numel} of {info.dtype}'}"
            )

    # -- introspection ------------------------------------------------------------

    def activator(self, t: int) -> int | None:
        """With ``activation="random"``: the rank that activates version t,
        the same on every rank (no communication); else None."""
        return self._activators(t) if self.activation == "random" else None

    def unconsumed(self) -> LikeT | None:
        """Under a ``late`` reading: a copy of this rank's contribution that no
        version has consumed yet (what it would add to the next version), or
        None; also after :meth:`close`."""
        return self._engine.unconsumed() if self._engine else None

    @property
    def state(self) -> str:
        """``"new"``, ``"open"``, ``"closing"`` or ``"closed"``."""
        return self._state

    @property
    def history(self) -> list[tuple[int, int]]:
        """``(version, contribution_iteration)`` of the versions executed here."""
        return list(self._engine.history or ()) if self._engine else []

    @property
    def began(self) -> list[tuple[int, float]]:
        """``(version, time.perf_counter())`` when each of those versions
        began executing here (one clock for all processes of a node)."""
        return list(self._engine.began or ()) if self._engine else []


def _limited(limiter: int) -> int | None:
    """The ``tau`` of eager-SGD's limiter: N partial versions, then a synchronous one."""
    if isinstance(limiter, bool) or not isinstance(limiter, int) or limiter < 0:
        raise ValueError(f"limiter must be an int >= 0 (0: none), got {limiter!r}")
    return limiter + 1 if limiter else None


def solo_allreduce(
    comm: MPI.Intracomm, like: LikeT, *, late: Late = "drop", limiter: int = 32, **options: Any
) -> WaitAvoidingGroupAllreduce[LikeT]:
    """Eager-SGD's solo allreduce (Li et al., PPoPP 2020): the first rank to
    arrive at a version activates it, a reduction over all P ranks; a late
    rank's contribution meets ``late`` (:data:`LATE`; ``"drop"`` is what the
    reference code, ``Shigangli/eager-SGD``, does: its training scripts zero
    the send buffer after every call, so a version that began without a
    rank read zeros from it, and the gradient it then copies in is zeroed).

    ``limiter`` N > 0: after every N partial versions one synchronous
    version, which waits for every rank: iteration t is synchronous when
    (t + 1) mod (N + 1) == 0 (call :meth:`~WaitAvoidingGroupAllreduce.sync_allreduce`
    there; :meth:`~WaitAvoidingGroupAllreduce.is_group_version` says which).
    The reference's ``fflib2/src/colls/ffsolo_limiter.c`` rotates its start
    over N asynchronous activators and one synchronous allreduce, with N =
    ``LIMITER`` = 32 in its training scripts; 0: no limiter.
    """
    return WaitAvoidingGroupAllreduce(
        comm, like, group_size=comm.Get_size(), tau=_limited(limiter), activation="first", late=late, **options
    )


def majority_allreduce(
    comm: MPI.Intracomm,
    like: LikeT,
    *,
    late: Late = "drop",
    activation: Literal["random", "half"] = "random",
    limiter: int = 0,
    **options: Any,
) -> WaitAvoidingGroupAllreduce[LikeT]:
    """Eager-SGD's majority allreduce: a reduction over all P ranks that one
    rank per version activates, drawn from a seeded sequence the same on
    every rank (``activation="random"``, ``activator_seed``; the reference's
    ``fflib2/src/colls/ffrand_allreduce.c``), or that starts once ceil(P/2)
    ranks have arrived (``activation="half"``).  ``late`` and ``limiter`` as
    in :func:`solo_allreduce`; the reference's majority has no limiter (its
    use in ``ffrand_allreduce.c`` is commented out), hence 0 here."""
    if activation not in ("random", "half"):
        raise ValueError(f"a majority allreduce's activation must be 'random' or 'half', got {activation!r}")
    return WaitAvoidingGroupAllreduce(
        comm, like, group_size=comm.Get_size(), tau=_limited(limiter), activation=activation, late=late, **options
    )
