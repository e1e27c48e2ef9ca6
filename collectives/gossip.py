"""Asynchronous pairwise averaging on a bipartite ring (AD-PSGD's communication thread)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Generic

import numpy as np
from mpi4py import MPI

from .backoff import Backoff
from .buffers import LikeT, copy_into, copy_of, empty_like, zeros_like
from .comm import Communicator
from .compression.allreduce import compressor_for, encode_with_feedback, host_view

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self is Python 3.11's

__all__ = ["PairwiseGossip", "active_ranks", "apply_half_difference", "fold_pending", "is_active"]

_REQUEST, _REPLY, _DONE = 51, 52, 53


def is_active(rank: int, size: int) -> bool:
    """Whether ``rank`` starts AD-PSGD's exchanges on a ring of ``size`` ranks.

    The even ranks, except rank P - 1 where P is odd (odd P > 1): the ring's
    two even ranks P - 1 and 0 are neighbours there, and with P - 1 passive
    no two active ranks are neighbours on any P.  So every neighbour of an
    active rank is passive, and every exchange pairs an active and a passive
    rank (:class:`PairwiseGossip` says why no cycle of waits can then form).
    """
    return rank % 2 == 0 and (rank != size - 1 or size == 1)


def active_ranks(size: int) -> range:
    """The ranks :func:`is_active` names on a ring of ``size`` ranks, in order."""
    return range(0, size - size % 2 if size > 1 else 1, 2)


def _neighbours(rank: int, size: int) -> list[int]:
    """``rank``'s ring neighbours, in the order an active rank asks them."""
    return sorted({(rank - 1) % size, (rank + 1) % size} - {rank})


class PairwiseGossip(Generic[LikeT]):
    """Pairwise model averaging with ring neighbours, on a communication thread.

    Even ranks are *active* (:func:`is_active`; on an odd ring all but rank
    P - 1): each :meth:`step_done` makes their thread average once with a
    ring neighbour (its two in turn, the lower rank first).  The other ranks
    are *passive*: their thread serves the requests of their active
    neighbours, one at a time, and never asks.  Every exchange pairs an
    active and a passive rank, so no cycle of waits can form (AD-PSGD, Lian
    et al., ICML 2018, section 4): an active thread waits only for the
    passive partner it asked (its reply), a passive thread for nobody (the
    request it serves was sent whole before it began), so every wait goes
    from an active rank to a passive one and none leaves a passive rank,
    which a cycle would need.  On an odd ring no two active ranks are
    neighbours, and the one edge between passive ranks (P - 2 and P - 1)
    carries no exchange.  Any P (1: nothing is exchanged).

    One exchange of ranks i (active) and j (passive), over every buffer:
    i, under ``lock``, copies its model ``x_i`` (the buffers plus the
    differences still pending) and sends it; j receives it and, under
    ``lock``, copies its own ``x_j`` the same way, adds ``(x_i - x_j) / 2``
    to its pending differences, and replies with the copy; i, under ``lock``,
    adds ``(x_j - x_i) / 2`` to its pending differences.  The owner folds
    the pending differences into its buffers with :meth:`fold`, holding
    ``lock``, right after each of its local updates.  So the buffers change
    only inside the owner's update: a forward and backward pass reads one
    model, the one of its step's start (AD-PSGD's x-hat, Lian et al.,
    Algorithm 1), and its update lands on the model as averaged meanwhile,
    as there.  The sum of the models over the two ranks is unchanged by an
    exchange.

    Every exchange is logged (:attr:`log`): the partner, the role, and the
    owner's folds (its updates) done when this side copied its model and
    when it added its difference: what :mod:`wagma.emulate` needs to replay
    the run's arithmetic exactly.

    Lifecycle: :meth:`open` (collective), :meth:`step_done` after every local
    step, :meth:`close` (collective: active
    threads finish every requested exchange and tell their neighbours they
    are done; passive threads serve until their active neighbours are done).

    Staleness is bounded on both sides: after its k-th local step
    (:meth:`step_done`) a rank waits until it has taken part in at least
    k - ``max_pending`` exchanges, an active rank counting those it asked for,
    a passive rank those it served.  So a compute loop faster than the network
    cannot run ahead of the averaging without limit (with 1, the exchange
    requested after step t overlaps step t + 1).  A passive rank with two
    active neighbours, which each alternate between their two passive
    neighbours, is served once per step on average; one with a single active
    neighbour (ranks P - 2 and P - 1 of an odd ring) is asked in every other
    step of it, and waits instead for those requests, the ones that
    neighbour makes to it in its first k steps, less ``max_pending``.  Ranks
    must run the same number of steps.

    Args:
        comm: the MPI communicator (``MPI_THREAD_MULTIPLE`` needed).
        buffers: the same list of contiguous numpy arrays or torch tensors on
            every rank (the flat parameter buffers).
        lock: the lock that the owner holds while it modifies ``buffers``
            and calls :meth:`fold`.
        max_pending: requested exchanges that may be outstanding, >= 1.
        compression: ``"none"``, or a codec of
            :mod:`collectives.compression` for float32 buffers: each side
            sends its model encoded (with its residual) and takes the
            difference between the two decoded models, so that the pair's
            sum is still unchanged by an exchange.

    Attributes:
        log: one ``(peer, active, copied_after, applied_after)`` per
            exchange, in this rank's order: 1 where this rank was the active
            side, and the number of :meth:`fold` calls done when it copied
            its model and when it added its difference (equal on the passive
            side, which does both at once).
        exchanges: the exchanges done so far.
    """

    def __init__(
        self,
        comm: MPI.Intracomm,
        buffers: Iterable[LikeT],
        *,
        lock: contextlib.AbstractContextManager[Any],
        max_pending: int = 1,
        compression: str = "none",
    ) -> None:
        if isinstance(max_pending, bool) or not isinstance(max_pending, int) or max_pending < 1:
            raise ValueError(f"max_pending must be an int >= 1, got {max_pending!r}")
        self._raw, self.lock = comm, lock
        self.buffers: list[LikeT] = list(buffers)
        self.max_pending = max_pending
        size, rank = comm.Get_size(), comm.Get_rank()
        self.active = is_active(rank, size)
        self.neighbours = _neighbours(rank, size)
        #: The neighbours that ask this rank for exchanges (none for an active rank).
        self.askers = [] if self.active else [n for n in self.neighbours if is_active(n, size)]
        self._size, self._rank = size, rank
        self.exchanges = 0
        self.log: list[tuple[int, int, int, int]] = []
        self._folds = 0
        self._unfolded = False
        self._steps = 0
        self._requested = 0
        self._closing = False
        self._cond = threading.Condition()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        #: One compressed stream per buffer with ``compression`` (else None each).
        self.compressors = [compressor_for(compression, _numel(b)) for b in self.buffers]
        #: The bytes this rank sent in exchanges so far (the encoded ones when compressed).
        self.bytes_sent = 0

    def open(self) -> "Self":
        self._comm = Communicator(self._raw, thread_level=MPI.THREAD_MULTIPLE, yield_while_waiting=True)
        self._sent: list[LikeT] = [empty_like(b) for b in self.buffers]
        self._received: list[LikeT] = [empty_like(b) for b in self.buffers]
        self._pending: list[LikeT] = [zeros_like(b) for b in self.buffers]
        if self.neighbours:
            self._thread = threading.Thread(
                target=self._guarded(self._act if self.active else self._serve),
                name=f"gossip-{self._comm.rank}",
                daemon=True,
            )
            self._thread.start()
        return self

    def fold(self) -> None:
        """Add the pending differences to the buffers; the owner calls it
        after each local update, holding ``lock`` (an update is a fold
        whether or not a difference is pending, as :attr:`log` counts)."""
        self._folds += 1
        if self._unfolded:
            fold_pending(self.buffers, self._pending)
            self._unfolded = False

    def pending(self) -> list[LikeT]:
        """Copies of the differences not yet folded (the caller holds ``lock``):
        a checkpoint's share of the exchanges done since the last update."""
        return [copy_of(p) for p in self._pending]

    def load_pending(self, pending: Iterable[LikeT]) -> None:
        """Set the differences not yet folded (a checkpoint's, before the first update)."""
        for mine, saved in zip(self._pending, pending, strict=True):
            copy_into(mine, saved)
        self._unfolded = True

    def step_done(self) -> None:
        """After a local step: an active rank asks for one more exchange; any
        rank then waits until it is at most ``max_pending`` exchanges behind
        its steps."""
        self._raise_if_failed()
        if not self.neighbours:
            return
        with self._cond:
            self._steps += 1
            if self.active:
                self._requested += 1
                self._cond.notify_all()
            while self.exchanges < self._owed(self._steps) - self.max_pending and self._error is None:
                self._cond.wait()
        self._raise_if_failed()

    def _owed(self, steps: int) -> int:
        """The exchanges this rank takes part in once every rank has made
        ``steps`` steps: its own requests (active), ``steps`` for a passive
        rank with two active neighbours (together they ask ``steps`` or
        ``steps + 1`` times), else the requests of its one active neighbour,
        which asks its neighbours in turn."""
        if self.active or len(self.askers) == 2:
            return steps
        (asker,) = self.askers
        turn = _neighbours(asker, self._size)
        return len(range(turn.index(self._rank), steps, len(turn)))

    def close(self) -> None:
        """Finish all requested exchanges everywhere, join, then fold the
        differences still pending into the buffers (collective)."""
        if self._thread is not None:
            with self._cond:
                self._closing = True
                self._cond.notify()
            self._thread.join()
            self._thread = None
        self._comm.close()
        self._raise_if_failed()
        with self.lock:
            self.fold()

    def abandon(self) -> None:
        """Stop the communication thread without communicating (a failure:
        the channels are revoked, so an exchange in flight returns with an
        error and the thread ends).  The differences not yet folded are
        dropped with the replica they were for."""
        if self._thread is not None:
            with self._cond:
                self._closing = True
                self._cond.notify_all()
            self._thread.join(timeout=5.0)
            self._thread = None

    # -- the communication thread --------------------------------------------

    def _guarded(self, loop):
        def run():
            try:
                loop()
            except BaseException as exc:  # handed to the owner
                with self._cond:
                    self._error = exc
                    self._cond.notify_all()

        return run

    def _raise_if_failed(self):
        if self._error is not None:
            raise RuntimeError(f"gossip thread of rank {self._raw.Get_rank()} failed: {self._error!r}") from self._error

    def _act(self):
        while True:
            with self._cond:
                while self.exchanges == self._requested and not self._closing:
                    self._cond.wait()
                if self.exchanges == self._requested:
                    break
            self._exchange(self.neighbours[self.exchanges % len(self.neighbours)])
            with self._cond:
                self.exchanges += 1
                self._cond.notify_all()
        # Sent after every request: MPI keeps the order of one sender's messages.
        for peer in self.neighbours:
            self._comm.data.Send([b"", MPI.BYTE], peer, _DONE)

    def _exchange(self, peer):
        """Active side: send the model, receive the partner's, add half the difference."""
        with self.lock:
            wires = self._copy_model()
            copied_after = self._folds
        if wires is not None:
            incoming = self._incoming()
            requests = []
            for wire, received in zip(wires, incoming):
                requests.append(self._comm.data.Irecv(received, peer, _REPLY))
                requests.append(self._comm.isend(wire, peer, _REQUEST))
            self._comm.wait_all(requests)
            self._decode(incoming)
            with self.lock:
                self._add_half_difference()
                self.log.append((peer, 1, copied_after, self._folds))
            return
        with contextlib.ExitStack() as stack:
            requests = []
            for sent, received in zip(self._sent, self._received):
                s = stack.enter_context(self._comm.open_buffer(sent))
                r = stack.enter_context(self._comm.open_buffer(received))
                requests.append(self._comm.data.Irecv(r.msg(0, r.numel), peer, _REPLY))
                requests.append(self._comm.isend(s.msg(0, s.numel), peer, _REQUEST))
            self._comm.wait_all(requests)
        with self.lock:
            self._add_half_difference()
            self.log.append((peer, 1, copied_after, self._folds))

    def _serve(self):
        """Passive side: serve requests until every active neighbour is done."""
        done, status, backoff = set(), MPI.Status(), Backoff()
        while len(done) < len(self.askers):
            message = self._comm.data.improbe(MPI.ANY_SOURCE, MPI.ANY_TAG, status)
            if message is None:
                backoff.sleep()
                continue
            backoff.reset()
            peer = status.Get_source()
            if status.Get_tag() == _DONE:
                message.Recv([bytearray(0), MPI.BYTE])
                done.add(peer)
            else:
                self._serve_one(message, peer)
                with self._cond:
                    self.exchanges += 1
                    self._cond.notify_all()

    def _serve_one(self, first, peer):
        if self.compressors[0] is not None:
            incoming = self._incoming()
            for k, received in enumerate(incoming):
                if k == 0:
                    first.Recv(received)
                else:
                    self._comm.recv(received, peer, _REQUEST)
            self._decode(incoming)
            with self.lock:
                wires = self._copy_model()
                self._add_half_difference()
                self.log.append((peer, 0, self._folds, self._folds))
            assert wires is not None  # compressed
            self._comm.wait_all([self._comm.isend(wire, peer, _REPLY) for wire in wires])
            return
        with contextlib.ExitStack() as stack:
            for k, received in enumerate(self._received):
                r = stack.enter_context(self._comm.open_buffer(received))
                if k == 0:
                    first.Recv(r.msg(0, r.numel))
                else:
                    self._comm.recv(r.msg(0, r.numel), peer, _REQUEST)
        with self.lock:
            self._copy_model()
            self._add_half_difference()
            self.log.append((peer, 0, self._folds, self._folds))
        with contextlib.ExitStack() as stack:
            requests = []
            for sent in self._sent:
                s = stack.enter_context(self._comm.open_buffer(sent))
                requests.append(self._comm.isend(s.msg(0, s.numel), peer, _REPLY))
            self._comm.wait_all(requests)

    def _copy_model(self):
        """``sent = buffers + pending``: the model as it stands (under ``lock``);
        compressed, each ``sent`` encoded (with its residual) and made what
        its bytes decode to, and the bytes returned (else None)."""
        for sent, buffer, pending in zip(self._sent, self.buffers, self._pending):
            copy_into(sent, buffer)
            sent += pending
        if self.compressors[0] is None:
            self.bytes_sent += sum(_nbytes(b) for b in self._sent)
            return None
        wires = []
        for sent, compressor in zip(self._sent, self.compressors):
            assert compressor is not None  # one for every buffer or none
            array = host_view(sent)
            wires.append(encode_with_feedback(compressor.codec, array, compressor.residual, out=array))
            compressor.bytes_sent += wires[-1].size
        self.bytes_sent += sum(w.size for w in wires)
        return wires

    def _incoming(self):
        """Byte buffers for the partner's encoded buffers."""
        return [
            np.empty(c.codec.wire_nbytes(_numel(b)), np.uint8)
            for c, b in zip(self.compressors, self.buffers)
            if c is not None
        ]

    def _decode(self, incoming):
        for wire, received, compressor in zip(incoming, self._received, self.compressors):
            assert compressor is not None  # compressed
            compressor.codec.decode(wire, host_view(received))

    def _add_half_difference(self):
        """:func:`apply_half_difference` into the pending differences (under ``lock``)."""
        for pending, sent, received in zip(self._pending, self._sent, self._received):
            apply_half_difference(pending, sent, received)
        self._unfolded = True


def _numel(buffer) -> int:
    """Elements of a numpy array or torch tensor."""
    return int(buffer.size) if isinstance(buffer, np.ndarray) else int(buffer.numel())


def _nbytes(buffer) -> int:
    """Bytes of a numpy array or torch tensor."""
    return int(buffer.nbytes) if isinstance(buffer, np.ndarray) else int(buffer.numel() * buffer.element_size())


def fold_pending(buffers: Sequence[LikeT], pending: Sequence[LikeT]) -> None:
    """Add each pending difference to its buffer and zero it (the fold of
    :meth:`PairwiseGossip.fold`).  Numpy arrays or torch tensors."""
    for buffer, difference in zip(buffers, pending, strict=True):
        buffer += difference
        difference[...] = 0


def apply_half_difference(buffer: LikeT, sent: LikeT, received: LikeT) -> None:
    """One side of an exchange: ``buffer += (received - sent) / 2``, where
    ``sent`` is the copy of ``buffer`` this side sent and ``received`` the
    partner's; ``received`` is overwritten.  Applied to the *current*
    ``buffer``, so an update made since ``sent`` was copied is kept.  Numpy
    arrays or torch tensors."""
    received -= sent
    received *= 0.5
    buffer += received
