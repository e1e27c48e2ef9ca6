"""Moving per-rank records to one rank, and agreeing on a flag, without lock-stepping the ranks.

Training loops of asynchronous algorithms must not synchronise the ranks
to log what they measure, or to agree that the job should stop: a gather or
an allreduce every step would make every rank wait for the slowest one and
hide exactly the behaviour being measured.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
from mpi4py import MPI
from numpy.typing import ArrayLike

from .failures import any_source, track

__all__ = ["LaggedVote", "RootCollector"]

_ROWS, _FINAL = 1, 2


class RootCollector:
    """Rows of float64 records from every rank to ``root``, as they are made.

    :meth:`post` sends a block of rows with a nonblocking send on the
    collector's own duplicate of ``comm`` and returns at once; the root picks
    up what has arrived when it calls :meth:`poll` (matched probes, never
    waits).  :meth:`finish` is collective: every rank flushes its sends and
    the root receives until it has every rank's last block.  The order of
    one rank's blocks is kept (MPI's non-overtaking rule on one
    communicator); blocks of different ranks interleave.

    Args:
        comm: an ``mpi4py.MPI.Intracomm`` (duplicated; collective).
        width: the number of columns of every row.
        root: the rank that receives.
    """

    def __init__(self, comm: MPI.Intracomm, width: int, root: int = 0) -> None:
        self.comm = track(comm.Dup())
        self.width, self.root = int(width), root
        self.is_root = self.comm.Get_rank() == root
        self._sending: list[tuple[MPI.Request, np.ndarray]] = []  # (request, rows) until the send completes
        self._inbox: list[tuple[int, np.ndarray]] = []  # the root's own rows

    def post(self, rows: ArrayLike) -> None:
        """Send ``rows`` (``(n, width)``, converted to float64) to the root."""
        rows = np.ascontiguousarray(rows, dtype=np.float64).reshape(-1, self.width)
        if self.is_root:
            self._inbox.append((self.root, rows))
            return
        self._sending.append((self.comm.Isend(rows, dest=self.root, tag=_ROWS), rows))
        self._sending = [(req, buf) for req, buf in self._sending if not req.Test()]

    def poll(self) -> list[tuple[int, np.ndarray]]:
        """On the root: ``[(source rank, rows), ...]`` received since the last call."""
        out, self._inbox = self._inbox, []
        status = MPI.Status()
        while True:
            message = any_source(self.comm, self.comm.improbe, MPI.ANY_SOURCE, _ROWS, status)
            if message is None:
                return out
            out.append((status.Get_source(), self._receive(message, status)))

    def _receive(self, message: MPI.Message, status: MPI.Status) -> np.ndarray:
        rows = np.empty(status.Get_count(MPI.DOUBLE), dtype=np.float64)
        message.Recv(rows)
        return rows.reshape(-1, self.width)

    def finish(self, absent: Collection[int] = ()) -> list[tuple[int, np.ndarray]]:
        """Collective over the ranks not in ``absent`` (ranks that died: not
        waited for): the root gets every block not yet polled; others get ``[]``."""
        if not self.is_root:
            self.comm.Send(np.zeros(0), dest=self.root, tag=_FINAL)
            MPI.Request.Waitall([req for req, _ in self._sending])
            self._sending = []
            return []
        out = self.poll()
        waiting = self.comm.Get_size() - 1 - len(set(absent) - {self.root})
        status = MPI.Status()
        while waiting:
            message = any_source(self.comm, self.comm.mprobe, MPI.ANY_SOURCE, MPI.ANY_TAG, status)
            if status.Get_tag() == _FINAL:
                message.Recv(np.zeros(0))
                waiting -= 1
            else:
                out.append((status.Get_source(), self._receive(message, status)))
        return out

    def close(self) -> None:
        """Free the duplicate (after :meth:`finish`; collective)."""
        if self.comm != MPI.COMM_NULL:
            self.comm.Free()


class LaggedVote:
    """A logical OR over all ranks, answered ``period`` steps after it was asked.

    Call :meth:`vote` at every step with this rank's flag.  At steps that
    are multiples of ``period`` it completes the nonblocking allreduce started
    ``period`` steps earlier and starts the next one with the flag given now;
    so every rank gets the same answer at the same step (a job can stop at a
    step all ranks agree on, e.g. to checkpoint when Slurm signals some of
    them), and a rank waits for the others only when it is ``period`` steps
    ahead of the slowest one.  Between those steps :meth:`vote` returns
    False without communicating.

    Args:
        comm: an ``mpi4py.MPI.Intracomm`` (duplicated; collective).
        period: steps between answers, >= 1.
    """

    def __init__(self, comm: MPI.Intracomm, period: int) -> None:
        if isinstance(period, bool) or not isinstance(period, int) or period < 1:
            raise ValueError(f"period must be an int >= 1, got {period!r}")
        self.comm, self.period = track(comm.Dup()), period
        self._pending: MPI.Request | None = None
        self._send, self._recv = np.zeros(1, np.int32), np.zeros(1, np.int32)

    def vote(self, step: int, flag: bool) -> bool:
        """True on every rank when some rank's flag was set when the vote now
        answered was started; called with consecutive steps."""
        if step % self.period:
            return False
        answer = False
        if self._pending is not None:
            self._pending.Wait()
            answer = bool(self._recv[0])
        self._send[0] = int(bool(flag))
        self._pending = self.comm.Iallreduce(self._send, self._recv, op=MPI.LOR)
        return answer

    def close(self) -> None:
        """Complete the last vote and free the duplicate (collective)."""
        if self._pending is not None:
            self._pending.Wait()
            self._pending = None
        if self.comm != MPI.COMM_NULL:
            self.comm.Free()
