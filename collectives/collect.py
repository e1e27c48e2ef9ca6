"""Agreeing on a flag without lock-stepping the ranks.

Training loops of asynchronous algorithms must not synchronise the ranks
to agree that the job should stop: an allreduce every step would make every
rank wait for the slowest one and hide exactly the behaviour being measured.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from .failures import track, wait

__all__ = ["LaggedVote"]


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
            wait(self._pending)
            answer = bool(self._recv[0])
        self._send[0] = int(bool(flag))
        self._pending = self.comm.Iallreduce(self._send, self._recv, op=MPI.LOR)
        return answer

    def close(self) -> None:
        """Complete the last vote and free the duplicate (collective)."""
        if self._pending is not None:
            wait(self._pending)
            self._pending = None
        if self.comm != MPI.COMM_NULL:
            self.comm.Free()
