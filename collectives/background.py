"""Allreduce on a worker thread, in submission order: nonblocking for the caller."""

from __future__ import annotations

import queue
import threading
from typing import TYPE_CHECKING, Any, Generic

from mpi4py import MPI

from .buffers import BufferT
from .comm import Communicator
from .compression import Compressor, compressed_allreduce
from .failures import hold
from .schedules.blocking import AllreduceAlgorithm, Op, allreduce

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self is Python 3.11's

__all__ = ["BackgroundAllreduce", "PendingAllreduce"]


class PendingAllreduce(Generic[BufferT]):
    """A submitted allreduce; :meth:`~PendingAllreduce.wait` returns once its buffer holds the result."""

    def __init__(self, data: BufferT, compressor: Compressor | None = None) -> None:
        self.data: BufferT = data
        self.compressor = compressor
        self._done = threading.Event()
        self._error: BaseException | None = None

    def wait(self) -> BufferT:
        self._done.wait()
        if self._error is not None:
            raise RuntimeError(f"background allreduce failed: {self._error!r}") from self._error
        return self.data

    def test(self) -> bool:
        return self._done.is_set()


class BackgroundAllreduce:
    """Runs :func:`~collectives.schedules.blocking.allreduce` on a worker thread.

    ``submit(data)`` queues ``data`` and returns at once; the worker reduces
    queued buffers one after the other, in submission order, on a
    :class:`~collectives.comm.Communicator` of its own (so it never meets
    the main thread's messages).  Every rank must submit the same buffers
    (same sizes and dtypes) in the same order: the arguments are not checked
    per call.  This is how the backward pass overlaps with communication in
    Allreduce-SGD (DDP's bucket allreduce).

    Lifecycle: :meth:`open` (collective: duplicates the communicator, needs
    ``MPI_THREAD_MULTIPLE``), ``submit``/``wait``, :meth:`close` (waits for
    the queue to drain, joins the worker).

    Args:
        comm: the MPI communicator.
        algorithm, op: as for :func:`~collectives.schedules.blocking.allreduce`.
    """

    def __init__(self, comm: MPI.Intracomm, *, algorithm: AllreduceAlgorithm = "auto", op: Op = "sum") -> None:
        self._raw, self.algorithm, self.op = comm, algorithm, op
        self._queue: queue.Queue[PendingAllreduce[Any] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._comm: Communicator | None = None

    def open(self) -> "Self":
        if self._thread is not None:
            raise RuntimeError("BackgroundAllreduce is already open")
        self._comm = Communicator(self._raw, thread_level=MPI.THREAD_MULTIPLE)
        self._thread = threading.Thread(target=self._work, daemon=True, name=f"background-allreduce-{self._comm.rank}")
        self._thread.start()
        return self

    def submit(self, data: BufferT, compressor: Compressor | None = None) -> PendingAllreduce[BufferT]:
        """Queue the allreduce of ``data``; with ``compressor`` (the
        buffer's stream, :class:`~collectives.compression.allreduce.Compressor`) the
        compressed allreduce (:func:`~collectives.compression.allreduce.compressed_allreduce`)."""
        if self._thread is None:
            raise RuntimeError("BackgroundAllreduce is not open")
        pending = PendingAllreduce(data, compressor)
        self._queue.put(pending)
        return pending

    def _work(self):
        while True:
            pending = self._queue.get()
            if pending is None:
                return
            try:
                if pending.compressor is None:
                    allreduce(pending.data, comm=self._comm, algorithm=self.algorithm, op=self.op, check=False)
                else:
                    compressed_allreduce(pending.data, comm=self._comm, compressor=pending.compressor, op=self.op)
            except BaseException as exc:  # handed to the waiter
                pending._error = exc
            pending._done.set()

    def abandon(self) -> None:
        """Stop the worker without communicating (a failure: the channel is
        revoked, so an allreduce in flight ends with an error, handed to its
        waiter); the communicator is let go, not freed."""
        if self._thread is None:
            return
        self._queue.put(None)
        self._thread.join(timeout=5.0)
        self._thread = None
        hold(self)  # an allreduce it could not finish in 5 s: never freed under it

    def close(self) -> None:
        """Finish what was submitted, join the worker, free the communicator."""
        if self._thread is None:
            return
        self._queue.put(None)
        self._thread.join()
        self._thread = None
        assert self._comm is not None  # opened with the thread
        self._comm.close()

    def __enter__(self) -> "Self":
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()
