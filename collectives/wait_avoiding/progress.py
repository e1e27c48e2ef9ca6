"""The progress thread of the wait-avoiding group allreduce: activation and execution."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, Literal, get_args

import numpy as np
from mpi4py import MPI

from ..backoff import Backoff
from ..buffers import LikeT, address, copy_into, copy_of, empty_like, zeros_like
from ..failures import waitall
from .activation import ActivationState, version_from_tag, version_tag

if TYPE_CHECKING:
    from ..comm import Communicator
    from . import collective
    from .collective import Activation
    from .groups import GroupPlan

__all__ = ["IDLE_POLICIES", "Idle", "ProgressEngine"]

#: How an idle progress thread waits (see :class:`ProgressEngine`).
Idle = Literal["backoff", "park"]
#: The values of :data:`Idle`, in its order.
IDLE_POLICIES: tuple[Idle, ...] = get_args(Idle)

# Control messages: two int64s, ``[kind, dim]``; the tag carries the version.
_ACTIVATE = 0  # "activate every version up to this one", sent along dimension dim
_ARRIVE = 1  # "my main thread reached this version" (majority activation)


class ProgressEngine(Generic[LikeT]):
    """Executes every group version on one rank, actively or passively.

    Buffers change hands instead of being copied.  A contribution the main
    thread publishes is *lent*: every version executed from then on reads it
    (never writes it) until the next publication replaces it.  Every version
    writes its group sum out of place (the schedule's ``src``) into a buffer
    nobody holds, and that buffer goes to the main thread as its result; a
    published buffer that has been replaced and is no longer read joins the
    free ones.  So the main thread's model and the published contribution
    ping-pong between two buffers, and a stale result takes one more.

    With a ``late`` reading (eager-SGD's gradients) a contribution is
    consumed: the first version that begins after its publication reads it,
    and versions that begin before the next publication read zeros.  A late
    contribution, one published after its own version began, is discarded
    at once (``"drop"``), or waits for the next version, where a newer
    contribution replaces it (``"newest"``) or takes it in as a sum
    (``"accumulate"``).  The initial contribution (nothing computed yet)
    enters no version.

    Who activates version v (``activation``): every rank whose main thread
    arrives before v has begun here (``"first"``); only v's activator, a
    rank the ``activator`` sequence names, the same on every rank
    (``"random"``); or rank v mod P once ceil(P/2) main threads have
    arrived (``"half"``: the others send it an arrival message).  Who
    executes it: the main thread itself when it activates v and nothing has
    begun v here (every earlier version done); otherwise this thread, once v
    is activated: passively while the main thread computes (waits that
    yield the core), or for a main thread that waits for v.  Executions the main
    thread waits for spin in ``MPI_Waitall`` like the blocking group
    allreduce, or yield with ``yield_awaited`` (oversubscribed nodes).  One
    version at a time, in order.  While the main thread executes, this
    thread makes no MPI call (on MPICH its probes contend for the global
    lock and cost the main thread's transfers about a quarter of their time
    at 16 MiB); activations that arrive meanwhile are forwarded after it.
    That delays nothing the execution needs: the main thread activated v
    itself first, which sends this rank's target (>= v) on every dimension
    it had not covered (:meth:`~collectives.wait_avoiding.activation.ActivationState.activate`),
    so no activation of a version <= target that arrives later calls for a
    send, and later versions do not hold up v.

    Shared with the main thread, under one lock: the published contribution
    and its iteration, the highest version begun (``started``), the next
    version to execute, whether one is executing, the free buffers, the
    finished results, message counts.  Under a second lock (messaging),
    taken by the main thread only to activate the version it executes: the
    :class:`~collectives.wait_avoiding.activation.ActivationState`, the majority arrival
    counts and the sends in flight.

    The loop: receive control messages (forwarding activations at once), send
    what the main thread asked for, execute every activated version in order,
    and when none of this made progress wait (``idle``): ``"backoff"`` sleeps
    with back-off (0.1 ms doubling to 4 ms, cut short when the main thread
    hands work over), so an activation waits half a sleep on average before
    it is noticed, but the thread leaves the cores to compute; ``"park"``
    blocks in MPI (``MPI_Waitany``, the GIL released) on a control receive
    it keeps posted and on a receive of wake-ups, so an activation is
    noticed as soon as it arrives, at the price of the core the library's
    wait spins on.  In ``"park"`` the main thread wakes the thread with a
    message to itself on a communicator of its own (``wake``): when it
    hands work over, and before it executes a version itself, so that the
    thread is out of MPI while it does.  Data messages of version v carry
    the tag ``v mod (TAG_UB + 1)``.

    Args:
        comm: a :class:`~collectives.comm.Communicator` with yielding waits,
            used by this engine alone (``data``: group exchanges, ``control``:
            activations).
        like: the initial contribution (a copy is published as iteration
            ``first_iteration - 1``) and the template for every buffer.
        plan: ``plan(v)``, this rank's
            :class:`~collectives.wait_avoiding.groups.GroupPlan` of iteration v.
        schedule: a butterfly schedule,
            ``schedule(buf, comm, plan, scale, tag, src)``.
        average: the group's mean (the sum times 1 / the plan's group size)
            instead of its sum.
        is_group_version: whether iteration v is a group version (not a sync step).
        activation: ``"first"``, ``"random"`` or ``"half"`` (above).
        activator: with ``"random"``, ``activator(v)``, the rank that
            activates version v (:class:`~collectives.wait_avoiding.activation.RandomActivators`).
        history: how many ``(version, contribution_iteration)`` records to
            keep (and as many ``(version, began)`` ones, :attr:`began`), 0 for none.
        first_iteration: versions before it count as executed.
        yield_awaited: executions the main thread waits for yield the core
            instead of spinning.
        late: None (every version reads the last contribution published,
            however often: WAGMA's models), or ``"drop"``, ``"newest"`` or
            ``"accumulate"``: consume contributions (above).
        idle: ``"backoff"`` or ``"park"`` (above;
            :func:`~collectives.wait_avoiding.collective.resolve_idle` chooses).
    """

    def __init__(
        self,
        comm: Communicator,
        like: LikeT,
        *,
        plan: Callable[[int], GroupPlan],
        schedule: Callable[..., None],
        is_group_version: Callable[[int], bool],
        average: bool = False,
        activation: Activation = "first",
        activator: Callable[[int], int] | None = None,
        history: int = 0,
        first_iteration: int = 0,
        yield_awaited: bool = False,
        late: collective.Late | None = None,
        idle: Idle = "backoff",
    ) -> None:
        if idle not in IDLE_POLICIES:
            raise ValueError(f"idle must be one of {', '.join(map(repr, IDLE_POLICIES))}, got {idle!r}")
        self._comm = comm
        self.idle = idle
        self._awaited_comm = comm.waiting(yield_while_waiting=yield_awaited)
        self._rank, self._size = comm.rank, comm.size
        self._plan, self._schedule, self._average = plan, schedule, average
        self._is_group_version = is_group_version
        self._quorum = -(-self._size // 2) if activation == "half" else None
        self._activator = activator if activation == "random" else None
        # TAG_UB is the environment's, an attribute of MPI_COMM_WORLD (the
        # standard's environmental inquiries); Open MPI does not copy it to
        # communicators made by Split, MPICH answers on any communicator.
        tag_ub = comm.control.Get_attr(MPI.TAG_UB) or MPI.COMM_WORLD.Get_attr(MPI.TAG_UB)
        assert tag_ub is not None  # every MPI_COMM_WORLD has it
        self._tag_space = tag_ub + 1
        self._lock = threading.Lock()
        self._done = threading.Condition(self._lock)
        # Held while a thread receives, forwards or sends control messages;
        # never taken while holding _lock.
        self._messaging = threading.Lock()
        self._wake = threading.Event()
        # "park": the communicator of wake-ups (this rank alone: a duplicate of
        # MPI_COMM_SELF, so that ranks whose nodes chose differently do not
        # have to agree on a collective to make it), the
        # receives the thread keeps posted (control, wake-up) with their
        # buffers, whether it waits in MPI now and whether a wake-up is on
        # its way (both under _lock), and the wake-ups sent.
        self._wakes: MPI.Intracomm | None = MPI.COMM_SELF.Dup() if idle == "park" else None
        self._posted: list[MPI.Request] = []
        self._posted_payloads = (np.empty(2, dtype=np.int64), np.empty(1, dtype=np.int8))
        self._posted_status = MPI.Status()
        self._completed: int | None = None  # the posted receive Waitany completed, not handled yet
        self._parked = self._wake_on_its_way = False
        self._wake_sends: list[MPI.Request] = []
        # Shared with the main thread (under _lock).
        self._published: LikeT = copy_of(like)
        self._published_iteration = first_iteration - 1
        self._late = late
        # With a late reading: whether a version has read the published
        # contribution (the initial one counts as read), and what later ones
        # read instead.
        self._consumed = late is not None
        self._zeros: LikeT | None = zeros_like(like) if late is not None else None
        self._reading: LikeT | None = None  # the published buffer the executing version reads
        self._free: list[LikeT] = []
        self.started = first_iteration - 1
        self._next = self._following(first_iteration - 1)
        self._executing = False
        self._awaited: int | None = None  # the version the main thread waits for
        self._results: dict[int, tuple[LikeT, int]] = {}
        self._requests: list[int] = []
        self._sent = self._received = 0
        self._error: BaseException | None = None
        self._stop = False
        self.history: deque[tuple[int, int]] | None = deque(maxlen=history) if history else None
        #: ``(version, time.perf_counter() when it began executing here)``
        #: with ``history``: one clock for every process of a node, so the
        #: ranks' records say when an activation reached each of them.
        self.began: deque[tuple[int, float]] | None = deque(maxlen=history) if history else None
        # Owned by the progress thread.
        self._activation = ActivationState(self._rank, self._size, first_iteration - 1)
        self._arrivals: dict[int, int] = {}
        self._pending_sends: list[tuple[MPI.Request, np.ndarray]] = []
        self._thread = threading.Thread(target=self._run, name=f"wait-avoiding-progress-{self._rank}", daemon=True)

    # -- main-thread side ---------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def arrive(self, contribution: LikeT, t: int) -> tuple[LikeT, int]:
        """Lend ``contribution`` as iteration t; the result of version t.

        Fresh (version t has not begun here): t is activated (by this rank
        if it is an activator of t, else by another, once its rule is met)
        and executed with ``contribution``; by this thread at once when it
        may (see the class), else by the progress thread while this one
        waits.  Stale (t has begun): ``contribution`` serves later versions
        (with ``late="drop"`` none: it is discarded), and this thread waits
        for t's result.  Deciding and publishing happen under the lock the
        executor takes to begin a version, so no version begins between the
        two.  With ``late="accumulate"`` an unconsumed previous contribution
        is first added into ``contribution``.

        Returns ``(result buffer, contribution_iteration)``; the caller owns
        the buffer, and must not write ``contribution`` until it publishes
        another one.
        """
        with self._lock:
            self._raise_if_failed()
            self._check_not_lent(contribution)
            fresh = self.started < t
            self._settle(contribution)
            self._publish(contribution, t)
            if not fresh and self._late == "drop":
                self._consumed = True  # its version began without it: no version reads it
            activates = fresh and self._activates(t)
            if activates or (fresh and self._quorum is not None):
                self._requests.append(t)  # activations to send, or an arrival to announce
            execute_here = activates and self._next == t and not self._executing
            if execute_here:
                work = self._begin(t)
            else:
                self._awaited = t
        if not execute_here:
            self._signal()
            return self._result(t)
        with self._messaging:  # activate t as its root, forward what came in
            self._serve_requests()
            self._poll()
        self._signal()  # a parked thread leaves MPI while this one executes
        outcome = self._execute(work, self._awaited_comm)
        self._signal()  # activations of later versions may wait for this one
        return outcome

    def publish_copy(self, contribution: LikeT, t: int) -> None:
        """Publish a copy of ``contribution`` as iteration t (the caller keeps
        ``contribution``), activating nothing."""
        with self._lock:
            self._raise_if_failed()
            copy = self._take_free()
            copy_into(copy, contribution)
            self._publish(copy, t)

    def consume_into(self, contribution: LikeT) -> None:
        """A sync step under a late reading: settle ``contribution`` as a
        publication would (add an unconsumed earlier contribution into it,
        or drop that one), then leave nothing to read: versions that begin
        before the next publication read zeros.  Before the sync step's
        reduction, so that no version can read what it reduces."""
        with self._lock:
            self._raise_if_failed()
            self._settle(contribution)
            self._consumed = True

    def unconsumed(self) -> LikeT | None:
        """With a late reading: a copy of the contribution no version has
        read yet, or None."""
        with self._lock:
            if self._late is None or self._consumed:
                return None
            return copy_of(self._published)

    def _result(self, t: int):
        with self._done:
            while t not in self._results:
                self._raise_if_failed()
                self._done.wait()
            self._awaited = None
            return self._results.pop(t)

    def _check_not_lent(self, contribution):
        lent = address(contribution)
        held = [self._published, *self._free]
        if self._reading is not None:
            held.append(self._reading)
        if any(lent == address(b) for b in held):
            raise ValueError(
                "buf is a buffer this collective holds (the contribution published "
                f"as iteration {self._published_iteration}, or one it replaced): "
                "pass the buffer of the last result (result.value) or one of your own"
            )

    def counts(self) -> tuple[int, int]:
        """``(sent, received)`` control messages; a received one counts once
        everything it caused has been sent."""
        with self._lock:
            self._raise_if_failed()
            return self._sent, self._received

    def stop(self) -> None:
        """End the loop and join the thread; then complete the sends.

        Only once no message is in flight (see
        :meth:`collectives.wait_avoiding.collective.WaitAvoidingGroupAllreduce.close`), else a send may never
        complete.
        """
        self.halt()
        waitall([request for request, _ in self._pending_sends])
        self._pending_sends.clear()
        self._raise_if_failed()

    def halt(self, timeout: float | None = None) -> None:
        """End the loop and join the thread, without completing sends (at
        interpreter exit without close(), where peers may be gone)."""
        with self._lock:
            self._stop = True
        self._signal()
        self._thread.join(timeout)
        if not self._thread.is_alive() and self._wakes is not None:
            self._wakes.Free()
            self._wakes = None

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def parked(self) -> bool:
        """Whether the thread waits in MPI now (``idle="park"``, nothing to do)."""
        with self._lock:
            return self._parked

    def _raise_if_failed(self):
        if self._error is not None:
            raise RuntimeError(f"the progress thread of rank {self._rank} failed: {self._error!r}") from self._error

    # -- progress-thread side -----------------------------------------------

    def _run(self):
        backoff = Backoff()
        try:
            if self.idle == "park":
                self._post_receives()
            while True:
                self._wake.clear()
                with self._lock:
                    if self._stop:
                        return
                    quiet = self._executing
                if quiet:  # the main thread executes a version and wakes
                    self._wake.wait()  # this one when it is done
                    continue
                with self._messaging:
                    progressed = self._receive()
                    progressed |= self._serve_requests()
                    self._complete_sends()
                progressed |= self._execute_activated()
                if progressed:
                    backoff.reset()
                elif self.idle == "park":
                    self._park()
                else:
                    backoff.wait(self._wake)
        except BaseException as exc:  # handed to the main thread
            with self._done:
                self._error = exc
                self._done.notify_all()
        finally:
            if self._error is None:  # a failed MPI leaves its requests as they are
                self._cancel_posted()

    # -- parking (idle="park") ------------------------------------------------

    def _signal(self) -> None:
        """Wake the thread: set the event it sleeps or waits for the main
        thread on, and if it waits in MPI, send it a wake-up (one at a time)."""
        self._wake.set()
        if self._wakes is None:
            return
        with self._lock:
            if not self._parked or self._wake_on_its_way:
                return
            self._wake_on_its_way = True
            payload = np.zeros(1, dtype=np.int8)
            self._wake_sends.append(self._wakes.Isend(payload, 0, 0))

    def _post_receives(self):
        assert self._wakes is not None  # idle="park"
        control, wake = self._posted_payloads
        self._posted = [
            self._comm.control.Irecv(control, MPI.ANY_SOURCE, MPI.ANY_TAG),
            self._wakes.Irecv(wake, 0, 0),
        ]

    def _park(self):
        """Wait in MPI until a control message or a wake-up arrives (unless
        work was handed over since the loop looked)."""
        with self._lock:
            if self._wake.is_set() or self._stop:
                return
            self._parked = True
        try:
            self._completed = MPI.Request.Waitany(self._posted, self._posted_status)
        finally:
            with self._lock:
                self._parked = False

    def _take_posted(self) -> bool:
        """Handle the posted receives that completed, and post them again."""
        assert self._wakes is not None  # idle="park"
        control, wake = self._posted
        completed, self._completed = self._completed, None  # by Waitany, its status kept
        progressed = False
        if completed == 1 or wake.Test():
            with self._lock:
                self._wake_on_its_way = False
                sent, self._wake_sends = self._wake_sends, []
            MPI.Request.Waitall(sent)  # sends to this rank, received: complete
            self._posted[1] = self._wakes.Irecv(self._posted_payloads[1], 0, 0)
        if completed == 0 or control.Test(self._posted_status):
            payload = self._posted_payloads[0]
            self._handle(self._posted_status.Get_tag(), int(payload[0]), int(payload[1]))
            self._posted[0] = self._comm.control.Irecv(payload, MPI.ANY_SOURCE, MPI.ANY_TAG)
            progressed = True
        return progressed

    def _cancel_posted(self):
        """Withdraw the posted receives as the thread ends (no message is in
        flight once the collective closes; halt() may leave some behind)."""
        for request in self._posted:
            if request != MPI.REQUEST_NULL:
                request.Cancel()
        MPI.Request.Waitall(self._posted)
        with self._lock:
            sent, self._wake_sends = self._wake_sends, []
        self._posted = []
        if sent and self._wakes is not None:  # wake-ups no receive will take: take them here
            while self._wakes.Iprobe(0, 0):
                self._wakes.Recv(self._posted_payloads[1], 0, 0)
            MPI.Request.Waitall(sent)

    def _receive(self) -> bool:
        """Handle every control message that has come in (progress thread,
        under the messaging lock): the posted receive's (``"park"``), then
        those a probe finds."""
        progressed = self._take_posted() if self.idle == "park" else False
        return self._poll() or progressed

    def _poll(self) -> bool:
        """Receive every pending control message (matched probes, never a
        probe followed by a receive that another thread could race)."""
        status = MPI.Status()
        payload = np.empty(2, dtype=np.int64)
        progressed = False
        while True:
            message = self._comm.control.improbe(MPI.ANY_SOURCE, MPI.ANY_TAG, status)
            if message is None:
                return progressed
            message.Recv(payload)
            self._handle(status.Get_tag(), int(payload[0]), int(payload[1]))
            progressed = True

    def _handle(self, tag, kind, dim):
        """One control message received (under the messaging lock)."""
        version = version_from_tag(tag, self._next, self._tag_space)
        if kind == _ACTIVATE:
            self._send_activations(self._activation.receive(version, dim))
        else:
            self._count_arrival(version)
        with self._lock:
            self._received += 1

    def _serve_requests(self) -> bool:
        with self._lock:
            requests, self._requests = self._requests, []
        for t in requests:
            if self._quorum is None:
                self._send_activations(self._activation.activate(t))
            elif t % self._size == self._rank:
                self._count_arrival(t)
            else:
                self._send(t % self._size, t, _ARRIVE, -1)
        return bool(requests)

    def _count_arrival(self, version):
        """``"half"``: the leader activates once ``quorum`` ranks have arrived."""
        if version <= self._activation.target:
            return
        count = self._arrivals.get(version, 0) + 1
        if count < self._quorum:
            self._arrivals[version] = count
            return
        self._send_activations(self._activation.activate(version))
        self._arrivals = {v: n for v, n in self._arrivals.items() if v > self._activation.target}

    def _execute_activated(self) -> bool:
        progressed = False
        while True:
            with self._lock:
                if self._executing or self._next > self._activation.target:
                    return progressed
                work = self._begin(self._next)
                awaited = self._awaited == self._next
            outcome = self._execute(work, self._awaited_comm if awaited else self._comm)
            with self._done:
                self._results[work[0]] = outcome
                self._done.notify_all()
            progressed = True
            with self._messaging:  # forward activations that came in meanwhile
                self._receive()

    # -- either thread -------------------------------------------------------

    def _activates(self, t):
        """Whether this rank's arrival activates version t."""
        if self._quorum is not None:
            return False
        return self._activator is None or self._activator(t) == self._rank

    def _settle(self, contribution):
        """What a new contribution does to an earlier one no version has
        read (under the lock): ``"accumulate"`` adds it into the new one,
        ``"newest"`` lets the new one replace it, ``"drop"`` never leaves one."""
        if self._late == "accumulate" and not self._consumed:
            contribution += self._published

    def _publish(self, contribution, t):
        """Make ``contribution`` the published one (under the lock)."""
        replaced = self._published
        self._published, self._published_iteration = contribution, t
        self._consumed = False
        if replaced is not self._reading:
            self._free.append(replaced)

    def _take_free(self):
        return self._free.pop() if self._free else empty_like(self._published)

    def _begin(self, version):
        """Claim ``version`` for the calling thread (under the lock); under a
        late reading a consumed contribution reads as zeros, iteration -1."""
        self.started, self._executing = version, True
        if self.began is not None:
            self.began.append((version, time.perf_counter()))
        if self._late is not None and self._consumed:
            return version, self._zeros, -1, self._take_free()
        self._consumed = True
        self._reading = self._published
        return version, self._published, self._published_iteration, self._take_free()

    def _execute(self, work, comm):
        """Run ``work`` from :meth:`_begin`; ``(result, contribution_iteration)``."""
        version, source, contribution_iteration, result = work
        plan = self._plan(version)
        scale = 1.0 / plan.size if self._average else None
        with comm.open_buffer(result) as out, comm.open_buffer(source, writeback=False) as inp:
            self._schedule(out, comm, plan, scale, version_tag(version, self._tag_space), inp)
        with self._lock:
            self._executing, self._reading = False, None
            if source is not self._published and source is not self._zeros:
                self._free.append(source)
            self._next = self._following(version)
            if self.history is not None:
                self.history.append((version, contribution_iteration))
        return result, contribution_iteration

    def _following(self, version):
        version += 1
        while not self._is_group_version(version):
            version += 1
        return version

    def _send_activations(self, sends):
        for peer, version, dim in sends:
            self._send(peer, version, _ACTIVATE, dim)

    def _send(self, peer, version, kind, dim):
        payload = np.array([kind, dim], dtype=np.int64)
        request = self._comm.isend(payload, peer, version_tag(version, self._tag_space), channel=self._comm.control)
        self._pending_sends.append((request, payload))
        with self._lock:
            self._sent += 1

    def _complete_sends(self):
        self._pending_sends = [(r, p) for r, p in self._pending_sends if not r.Test()]
