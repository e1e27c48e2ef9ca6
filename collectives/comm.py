"""The communicator wrapper every collective of this package runs on."""

from __future__ import annotations

import copy
import os
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from mpi4py import MPI

from .backoff import Backoff
from .buffers import Buffer, FlatBuffer, StagingArea, Workspace, open_buffer
from .cuda import mpi_is_cuda_aware
from .failures import fault_tolerant, hold, revoked, track, waitall
from .schedules.tuning import TuningTable, load_tuning

__all__ = ["KEPT_SENDS", "Communicator", "THREAD_LEVEL_NAMES", "node_oversubscribed"]

# Waits that yield spin this long first: with a core per rank most transfers
# finish within it (a receiver that sleeps delays the copy only it performs),
# and on an oversubscribed node the spin costs little.
_SPIN_SECONDS = 2e-4

#: Under MPI fault tolerance, how many of a communicator's latest sends stay
#: unfreed after they complete (:meth:`Communicator.isend`).
KEPT_SENDS = 1024

THREAD_LEVEL_NAMES = {
    MPI.THREAD_SINGLE: "MPI_THREAD_SINGLE",
    MPI.THREAD_FUNNELED: "MPI_THREAD_FUNNELED",
    MPI.THREAD_SERIALIZED: "MPI_THREAD_SERIALIZED",
    MPI.THREAD_MULTIPLE: "MPI_THREAD_MULTIPLE",
}


class Communicator:
    """Private duplicates of an MPI communicator, for data and for control.

    The communicator given is duplicated twice (``MPI_Comm_dup``, collective
    over ``comm``): ``data`` carries the payload of the schedules, ``control``
    carries argument checks and, in the wait-avoiding collectives, activation
    messages.  Messages of two ``Communicator`` objects, or of the two
    channels of one, can therefore never match each other, whatever tags
    they use.

    One blocking collective at a time may run on a ``Communicator``; objects
    that run collectives from a progress thread own a ``Communicator`` of
    their own.

    Args:
        comm: the MPI communicator to duplicate (default ``MPI.COMM_WORLD``).
        thread_level: the MPI thread level the caller needs, one of
            ``MPI.THREAD_SINGLE``..``MPI.THREAD_MULTIPLE``; checked against
            ``MPI.Query_thread()`` before anything is duplicated.
        yield_while_waiting: wait for transfers by testing them, spinning
            for 0.2 ms and then sleeping with a back-off (10 us doubling to
            1 ms), instead of in ``MPI_Waitall``, which in MPICH spins for
            as long as it waits.  For progress threads: on a node with more
            ranks than cores, a thread spinning for a partner takes the core
            that partner needs to get there.

    Raises:
        RuntimeError: MPI was initialised below ``thread_level`` (same verdict
            on every rank, so no rank is left waiting in the duplication).

    Example::

        with Communicator(MPI.COMM_WORLD) as comm:
            allreduce(grads, comm=comm, op="avg")
    """

    def __init__(
        self,
        comm: MPI.Intracomm | None = None,
        *,
        thread_level: int = MPI.THREAD_SINGLE,
        yield_while_waiting: bool = False,
    ) -> None:
        if thread_level not in THREAD_LEVEL_NAMES:
            raise ValueError(
                f"thread_level must be one of MPI.THREAD_SINGLE, "
                f"THREAD_FUNNELED, THREAD_SERIALIZED, THREAD_MULTIPLE, "
                f"got {thread_level!r}"
            )
        provided = MPI.Query_thread()
        if provided < thread_level:
            raise RuntimeError(
                f"this collective needs {THREAD_LEVEL_NAMES[thread_level]} "
                f"but MPI was initialised with {THREAD_LEVEL_NAMES[provided]}; "
                f"set mpi4py.rc.thread_level = 'multiple' before importing "
                f"mpi4py.MPI (it is mpi4py's default) and use an MPI library "
                f"built with thread support"
            )
        comm = MPI.COMM_WORLD if comm is None else comm
        if not isinstance(comm, MPI.Intracomm):
            raise TypeError(f"comm must be an mpi4py.MPI.Intracomm, got {type(comm).__name__}")
        self.data = track(comm.Dup())
        self.control = track(comm.Dup())
        self.rank = self.data.Get_rank()
        self.size = self.data.Get_size()
        self.staging = StagingArea()
        self.workspace = Workspace()
        self.yield_while_waiting = yield_while_waiting
        self._tuning: TuningTable | None = None
        self._tuning_loaded = False
        self._let_go = False  # closed without freeing: revoked after a failure
        #: Whether the job runs under MPI fault tolerance (:func:`~collectives.failures.fault_tolerant`).
        self.fault_tolerant = fault_tolerant()
        # Under fault tolerance the latest sends, persistent and unfreed (isend).
        self._kept_sends: deque[MPI.Prequest] | None = deque() if self.fault_tolerant else None
        # What derived() made from this communicator, closed with it.
        self._derived: dict[Hashable, Any] = {}

    @property
    def tuning(self) -> TuningTable | None:
        """The allreduce tuning table for this communicator's library, size
        and node shape (:mod:`.tuning`), or None where there is none.

        Loaded the first time it is asked for, collectively over the control
        channel: every rank must ask at the same point, as
        ``allreduce(algorithm="auto")`` does on every rank.
        """
        if not self._tuning_loaded:
            self._check_open()
            self._tuning = load_tuning(self.control)
            self._tuning_loaded = True
        return self._tuning

    @property
    def cuda_aware(self) -> bool:
        """Whether CUDA buffers go to MPI directly (see :mod:`.cuda`)."""
        return mpi_is_cuda_aware()

    @property
    def closed(self) -> bool:
        return self._let_go or self.data == MPI.COMM_NULL

    def open_buffer(self, data: Buffer, writeback: bool = True) -> AbstractContextManager[FlatBuffer]:
        """:func:`~collectives.buffers.open_buffer` with this communicator's
        CUDA-awareness, staging area and workspace."""
        return open_buffer(
            data, cuda_aware=self.cuda_aware, staging=self.staging, workspace=self.workspace, writeback=writeback
        )

    def derived(self, key: Hashable, make: Callable[[], Any]) -> Any:
        """What ``make()`` makes from this communicator for ``key``, made the
        first time it is asked for and closed (its ``close()``) with this
        communicator: the butterfly groups' communicators, for example.
        Collective where ``make`` is: every rank must ask at the same point."""
        if key not in self._derived:
            self._check_open()
            self._derived[key] = make()
        return self._derived[key]

    def waiting(self, yield_while_waiting: bool) -> Communicator:
        """This communicator (same duplicates, staging area and workspace)
        with another wait policy; :meth:`close` the original only."""
        view = copy.copy(self)
        view.yield_while_waiting = yield_while_waiting
        return view

    def isend(self, send: Buffer, dest: int, tag: int, channel: MPI.Comm | None = None) -> MPI.Request:
        """Post ``send`` to ``dest`` on ``channel`` (the data channel unless given).

        Under MPI fault tolerance the send is persistent (``MPI_Send_init``,
        ``MPI_Start``) and is freed only once :data:`KEPT_SENDS` later sends
        of this communicator were posted.  Why: Open MPI (5.0.11's ob1, the
        wheel's) ends the whole job, "Send error after request freed" on no
        communicator, when a send whose request is freed (completing a
        nonpersistent request frees it) learns afterwards that its message
        was dropped, as it is when the peer revokes the communicator before
        receiving it, which the survivors of a dead rank do
        (:func:`~collectives.failures.revoke_tracked`).  Measured with a
        recursive-doubling exchange of 104 KB on 8 ranks, one SIGKILLed
        mid-run, then revoke and shrink: three jobs of three ended so with
        nonpersistent sends, none with persistent ones kept.  A peer
        receives a message within the operation it belongs to, and no
        schedule here lets ranks drift more than an operation apart, so a
        send KEPT_SENDS sends old was received long ago; one still active
        then (a failure ended its operation) is held, never freed
        (:func:`~collectives.failures.hold`).
        """
        channel = self.data if channel is None else channel
        if self._kept_sends is None:
            return channel.Isend(send, dest, tag)
        request = channel.Send_init(send, dest, tag)
        request.Start()
        self._kept_sends.append(request)
        if len(self._kept_sends) > KEPT_SENDS:
            oldest = self._kept_sends.popleft()
            if oldest.Test():
                oldest.Free()
            else:
                hold(oldest)
        return request

    def exchange(self, send: Buffer, dest: int, recv: Buffer, source: int, tag: int) -> None:
        """Send ``send`` to ``dest`` while receiving ``recv`` from ``source``.

        Either side may be an empty buffer, in which case it is skipped; the
        schedules only skip a message when its peer skips the matching one.
        Both transfers are posted before either is waited for, so a cycle of
        exchanges cannot deadlock.
        """
        self._check_open()
        requests = []
        if len(recv):
            requests.append(self.data.Irecv(recv, source, tag))
        if len(send):
            requests.append(self.isend(send, dest, tag))
        self.wait_all(requests)

    def send(self, send: Buffer, dest: int, tag: int) -> None:
        """Blocking send on the data channel (skipped when empty)."""
        self._check_open()
        if len(send):
            self.wait_all([self.isend(send, dest, tag)])

    def recv(self, recv: Buffer, source: int, tag: int) -> None:
        """Blocking receive on the data channel (skipped when empty)."""
        self._check_open()
        if len(recv):
            self.wait_all([self.data.Irecv(recv, source, tag)])

    def wait_all(self, requests: Sequence[MPI.Request]) -> None:
        """Complete ``requests``, spinning in ``MPI_Waitall`` or, with
        ``yield_while_waiting``, testing with a back-off; a failure holds
        them (:func:`collectives.failures.hold`) and propagates."""
        if not self.yield_while_waiting:
            waitall(list(requests))
            return
        spin_until = time.perf_counter() + _SPIN_SECONDS
        backoff = Backoff(1e-5, 1e-3)
        try:
            while not MPI.Request.Testall(requests):
                if time.perf_counter() > spin_until:
                    backoff.sleep()
        except MPI.Exception:
            hold(list(requests))  # none left active may be freed under its transfer
            raise

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("Communicator is closed")

    def close(self) -> None:
        """Free both duplicates; collective over the original communicator.
        Duplicates revoked after a failure (ULFM) are let go instead: peers
        may be dead, and nothing can be sent on them any more."""
        if not self.closed:
            let_go = revoked(self.data) or revoked(self.control)
            for request in self._kept_sends or ():  # every peer received them, unless a failure came between
                if not let_go and request.Test():
                    request.Free()
                else:
                    hold(request)
            made, self._derived = list(self._derived.values()), {}
            for each in made:
                each.close()
            self._kept_sends = None if self._kept_sends is None else deque()
            if let_go:
                self._let_go = True
            else:
                self.data.Free()
                self.control.Free()
            self.staging.clear()
            self.workspace.clear()

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"rank {self.rank} of {self.size}"
        return f"<Communicator {state}>"


def node_oversubscribed(comm: MPI.Intracomm, threads_per_rank: int = 1) -> bool:
    """Whether the ranks of ``comm`` on this node share fewer cores than
    they run threads that want one (``threads_per_rank`` each).

    Collective over ``comm``.  The cores are the union of the local ranks'
    CPU affinity sets (``os.sched_getaffinity``; all of ``os.cpu_count()``
    where it does not exist), so ranks bound to the same few cores count as
    oversubscribed.  Open MPI makes its waits yield in that case
    (``mpi_yield_when_idle``); the wait-avoiding collective does the same,
    and with 2 threads per rank decides whether its progress threads may
    wait in MPI.  The verdict is this node's and may differ across nodes.
    """
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        if hasattr(os, "sched_getaffinity"):
            cores = os.sched_getaffinity(0)
        else:
            cores = set(range(os.cpu_count() or 1))
        return len(set().union(*node.allgather(cores))) < threads_per_rank * node.Get_size()
    finally:
        node.Free()
