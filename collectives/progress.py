"""The progress thread of the wait-avoiding group allreduce: activation and execution."""

import functools
import threading
from collections import deque

import numpy as np
from mpi4py import MPI

from .activation import ActivationState, version_from_tag, version_tag
from .backoff import Backoff
from .buffers import copy_into, empty_like

__all__ = ["ProgressEngine"]

# Control messages: two int64s, ``[kind, dim]``; the tag carries the version.
_ACTIVATE = 0   # "activate every version up to this one", sent along dimension dim
_ARRIVE = 1     # "my main thread reached this version" (majority activation)


class ProgressEngine:
    """Executes every group version on one rank, actively or passively.

    Shared with the main thread, under one lock: the published contribution
    (the newest local model and its iteration), the highest version whose
    execution has begun (``started``), the finished results, message counts.
    The thread alone owns the :class:`~collectives.activation.ActivationState`
    and the majority arrival counts.

    The loop: receive control messages (forwarding activations at once), send
    what the main thread asked for, execute every activated version in order,
    and when none of this made progress sleep with back-off (0.1 ms doubling
    to 4 ms, cut short when the main thread hands work over).  Executing
    version v: copy the published contribution (noting its iteration), run
    the butterfly schedule of iteration v on the data channel with tag
    ``v mod (TAG_UB + 1)``, store the group sum for the main thread.

    Args:
        comm: a :class:`~collectives.comm.Communicator` used by this thread
            alone (``data``: group exchanges, ``control``: activations).
        like: the initial contribution (published as iteration -1) and the
            template for every buffer.
        masks: ``masks(v)``, the butterfly masks of iteration v.
        schedule: a butterfly schedule,
            ``schedule(buf, comm, masks, scale, tag, overlap)``.
        scale: None for the group sum, or the factor of the mean (1 / S).
        is_group_version: whether iteration v is a group version (not a sync step).
        quorum: None to let every arriving rank activate (first arrival), or
            the number of arrivals the leader of version v (rank v mod P)
            waits for before activating (majority).
        history: how many ``(version, contribution_iteration)`` records to
            keep, 0 for none.
        first_iteration: versions before it count as executed; ``like`` is
            published as iteration ``first_iteration - 1``.
    """

    def __init__(self, comm, like, *, masks, schedule, is_group_version,
                 scale=None, quorum=None, history=0, first_iteration=0):
        self._comm = comm
        self._rank, self._size = comm.rank, comm.size
        self._masks, self._schedule, self._scale = masks, schedule, scale
        self._is_group_version = is_group_version
        self._quorum = quorum
        self._tag_space = comm.control.Get_attr(MPI.TAG_UB) + 1
        self._lock = threading.Lock()
        self._done = threading.Condition(self._lock)
        self._wake = threading.Event()
        # Shared with the main thread (under _lock).
        self._published = empty_like(like)
        copy_into(self._published, like)
        self._published_iteration = first_iteration - 1
        self.started = first_iteration - 1
        self._arrived = {}        # version -> the main thread's buffer, reduced in place
        self._results = {}
        self._spare = []
        self._requests = []
        self._sent = self._received = 0
        self._error = None
        self._stop = False
        self.history = deque(maxlen=history) if history else None
        # Owned by the progress thread.
        self._activation = ActivationState(self._rank, self._size, first_iteration - 1)
        self._next = self._following(first_iteration - 1)
        self._arrivals = {}
        self._pending_sends = []
        self._thread = threading.Thread(
            target=self._run, name=f"wait-avoiding-progress-{self._rank}",
            daemon=True)

    # -- main-thread side ---------------------------------------------------

    def start(self):
        self._thread.start()

    def arrive(self, contribution, t: int):
        """Publish ``contribution`` as iteration t; activate t unless it began.

        If version t has not begun here, this rank's contribution to it is
        fresh: version t, the next to run here, will be reduced in place in
        ``contribution`` itself (the main thread waits for it, so nothing
        else writes there), and the copy that publishes it for later versions
        is taken by the progress thread while the first message of version t
        is in flight.  If version t has begun, the contribution is stale: it
        is copied now and serves later versions.  Deciding and publishing
        happen under the lock that the progress thread takes to begin a
        version, so no version begins between the two.
        """
        with self._lock:
            self._raise_if_failed()
            fresh = self.started < t
            if fresh:
                self._arrived[t] = contribution
                self._requests.append(t)
            else:
                copy_into(self._published, contribution)
                self._published_iteration = t
        if fresh:
            self._wake.set()

    def publish(self, contribution, t: int):
        """Publish ``contribution`` as iteration t without activating anything."""
        with self._lock:
            self._raise_if_failed()
            copy_into(self._published, contribution)
            self._published_iteration = t

    def result(self, t: int):
        """Wait for version t; returns ``(reduced buffer, contribution_iteration)``.

        The buffer is the main thread's own when it arrived before version t
        began, else an internal one to :meth:`recycle` after use.
        """
        with self._done:
            while t not in self._results:
                self._raise_if_failed()
                self._done.wait()
            return self._results.pop(t)

    def recycle(self, buffer):
        """Give back a result buffer once the caller is done with it."""
        with self._lock:
            self._spare.append(buffer)

    def counts(self):
        """``(sent, received)`` control messages; a received one counts once
        everything it caused has been sent."""
        with self._lock:
            self._raise_if_failed()
            return self._sent, self._received

    def stop(self):
        """End the loop and join the thread; then complete the sends.

        Only once no message is in flight (see
        :meth:`WaitAvoidingGroupAllreduce.close`), else a send may never
        complete.
        """
        self.halt()
        MPI.Request.Waitall([request for request, _ in self._pending_sends])
        self._pending_sends.clear()
        self._raise_if_failed()

    def halt(self, timeout=None):
        """End the loop and join the thread, without completing sends (at
        interpreter exit without close(), where peers may be gone)."""
        with self._lock:
            self._stop = True
        self._wake.set()
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _raise_if_failed(self):
        if self._error is not None:
            raise RuntimeError(
                f"the progress thread of rank {self._rank} failed: "
                f"{self._error!r}") from self._error

    # -- progress-thread side -----------------------------------------------

    def _run(self):
        backoff = Backoff()
        try:
            while True:
                self._wake.clear()
                with self._lock:
                    if self._stop:
                        return
                progressed = self._poll()
                progressed |= self._serve_requests()
                progressed |= self._execute_activated()
                self._complete_sends()
                if progressed:
                    backoff.reset()
                else:
                    backoff.wait(self._wake)
        except BaseException as exc:  # handed to the main thread
            with self._done:
                self._error = exc
                self._done.notify_all()

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
            version = version_from_tag(status.Get_tag(), self._next, self._tag_space)
            kind, dim = int(payload[0]), int(payload[1])
            if kind == _ACTIVATE:
                self._send_activations(self._activation.receive(version, dim))
            else:
                self._count_arrival(version)
            with self._lock:
                self._received += 1
            progressed = True

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
        """Majority: the leader activates once ``quorum`` ranks have arrived."""
        if version <= self._activation.target:
            return
        count = self._arrivals.get(version, 0) + 1
        if count < self._quorum:
            self._arrivals[version] = count
            return
        self._send_activations(self._activation.activate(version))
        self._arrivals = {v: n for v, n in self._arrivals.items()
                          if v > self._activation.target}

    def _execute_activated(self) -> bool:
        progressed = False
        while self._next <= self._activation.target:
            version = self._next
            with self._lock:
                work = self._arrived.pop(version, None)
                if work is None:   # passive: the last published contribution
                    work = self._spare.pop() if self._spare else empty_like(self._published)
                    copy_into(work, self._published)
                    contribution_iteration, publish = self._published_iteration, None
                else:              # active: publish W'_t while sending
                    contribution_iteration = version
                    publish = functools.partial(copy_into, self._published, work)
                self.started = version
            with self._comm.open_buffer(work) as buf:
                self._schedule(buf, self._comm, self._masks(version), self._scale,
                               version_tag(version, self._tag_space), publish)
            if publish is not None:
                with self._lock:
                    self._published_iteration = version
            with self._done:
                self._results[version] = (work, contribution_iteration)
                if self.history is not None:
                    self.history.append((version, contribution_iteration))
                self._done.notify_all()
            self._next = self._following(version)
            progressed = True
            self._poll()  # forward activations that came in meanwhile
        return progressed

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
        request = self._comm.control.Isend(
            payload, peer, version_tag(version, self._tag_space))
        self._pending_sends.append((request, payload))
        with self._lock:
            self._sent += 1

    def _complete_sends(self):
        self._pending_sends = [(r, p) for r, p in self._pending_sends if not r.Test()]
