"""StragglAR's runtime over MPI, and the Broadcast baseline it is compared with.

Both are straggler-aware: they know which rank is late and let the others
start without it (StragglAR paper, section 3 and "Broadcast" in section 4).

* ``"stragglar"``: while the straggler is late, the n - 1 others run a
  ReduceScatter among themselves (non-straggler g then holds chunk g of the
  n - 1 chunks reduced over them); when it arrives, every rank follows the
  rounds of a :class:`~collectives.stragglar.schedule.Schedule`, sending at most one chunk and
  receiving at most one chunk per round.
* ``"broadcast"``: while the straggler is late, the others run a whole
  Allreduce; when it arrives it swaps its entire buffer with one of them,
  both add, and the two broadcast the result by doubling: ceil(log2 n)
  rounds of s bytes each, as ``log n (alpha + s beta)`` in the paper's
  Table 1 assumes.

All data moves as point-to-point messages of :class:`~collectives.comm.Communicator`,
like the ring and RHD allreduce of :mod:`collectives.schedules.blocking`, so
that benchmarks compare algorithms and not transports.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Literal, get_args

import numpy as np
from mpi4py import MPI

from ..agreement import agree
from ..buffers import Buffer, BufferT, describe
from ..comm import Communicator
from ..compression.allreduce import Compressor, chunk_bounds, float32_on_host
from ..schedules.blocking import (
    REDUCE_SCATTER_ALGORITHMS,
    Op,
    ReduceScatterAlgorithm,
    choice_problem,
    reduction_problem,
)
from ..schedules.halving_doubling import rhd_allreduce
from ..schedules.partition import block_offsets
from ..schedules.ring import ring_allreduce
from .compressed import compressed_stragglar
from .plans import rank_steps, shared_plan
from .verify import verify

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self is Python 3.11's

    # The full path in the annotation: the reference then names the Schedule of this
    # package, not wagma.emulate's.
    import collectives.stragglar.schedule

__all__ = ["STRAGGLER_AWARE_ALGORITHMS", "StragglerAwareAlgorithm", "StragglerAwareAllreduce", "stragglar_allreduce"]

#: Straggler-aware allreduce algorithms of :class:`StragglerAwareAllreduce`.
StragglerAwareAlgorithm = Literal["stragglar", "broadcast"]
#: The values of :data:`StragglerAwareAlgorithm`, in its order.
STRAGGLER_AWARE_ALGORITHMS: tuple[StragglerAwareAlgorithm, ...] = get_args(StragglerAwareAlgorithm)

# Tags on the data channel; every call is blocking and every rank walks the
# rounds in the same order, so one tag per phase suffices (see ring.py).
_TAG_ROUNDS = 31
_TAG_BROADCAST = 32


class StragglerAwareAllreduce:
    """An allreduce planned for one communicator, one straggler and one buffer.

    Construction is collective over ``comm`` (every rank, the straggler
    included): it checks the arguments on every rank together, generates
    and verifies the schedule, and splits off a communicator of the
    non-stragglers.  Each call then reduces a buffer shaped like
    ``template``: on return every rank holds the sum (or mean) of all n
    ranks' inputs, bitwise equal on all ranks (each chunk is added once, by
    the straggler and its round's partner, in either order - float addition
    is commutative - and copied from there).

    The straggler's late arrival is the point: the others enter, run their
    pre-phase (ReduceScatter for ``"stragglar"``, Allreduce for
    ``"broadcast"``) and only then need it.  So a call checks its buffer
    against the template on the calling rank only, and the non-stragglers
    agree among themselves; an agreement that included the straggler would
    make everyone wait for it, the very wait this algorithm hides.  Under
    ``python -m mpi4py`` an error on the straggler aborts the job instead of
    leaving its peers waiting.

    Args:
        comm: a :class:`~collectives.comm.Communicator`.
        straggler: the rank expected to arrive last (the same on all ranks).
        template: a numpy array or torch tensor with the element count and
            dtype of the buffers to reduce.
        algorithm: ``"stragglar"`` or ``"broadcast"``.
        op: ``"sum"`` or ``"avg"``.
        schedule: a :class:`~collectives.stragglar.schedule.Schedule` for ``comm.size`` ranks
            and this straggler, verified on every rank before use; default:
            the generator's, from the plan of n that rank 0 reads from the
            plan cache or generates and verifies once, shared with the other
            ranks and relabelled for each straggler
            (:func:`~collectives.stragglar.plans.shared_plan`; a new
            straggler then costs each rank milliseconds at n = 1024).
        reduce_scatter: the non-stragglers' ReduceScatter schedule, a key
            of :data:`collectives.schedules.blocking.REDUCE_SCATTER_ALGORITHMS`.

    Attributes:
        reduce_scatter_s: the seconds this rank spent in the
            non-stragglers' ReduceScatter at its last call of
            ``"stragglar"`` (NaN on the straggler and before the first
            call): the ``RS`` of the lead gate of
            :mod:`collectives.stragglar.training_sync`.

    Raises:
        ValueError, TypeError: on every rank, before any data moves.

    Example::

        with StragglerAwareAllreduce(comm, straggler=3, template=grads) as ar:
            for step in range(steps):
                ...
                ar(grads)
    """

    def __init__(
        self,
        comm: Communicator,
        straggler: int,
        template: Buffer,
        *,
        algorithm: StragglerAwareAlgorithm = "stragglar",
        op: Op = "sum",
        schedule: collectives.stragglar.schedule.Schedule | None = None,
        reduce_scatter: ReduceScatterAlgorithm = "ring",
    ) -> None:
        info = describe(template)
        problem = (
            reduction_problem(info, reduce_scatter, REDUCE_SCATTER_ALGORITHMS, op)
            or choice_problem("algorithm", algorithm, STRAGGLER_AWARE_ALGORITHMS)
            or _rank_problem(straggler, comm.size)
        )
        if problem is None and algorithm == "stragglar" and schedule is not None:
            problem = _schedule_problem(schedule, comm.size, straggler)
        agree(
            comm,
            "StragglerAwareAllreduce",
            problem,
            info.error,
            straggler=straggler,
            numel=info.numel,
            dtype=info.dtype,
            algorithm=algorithm,
            op=op,
            reduce_scatter=reduce_scatter,
        )
        self.comm, self.straggler, self.algorithm, self.op = comm, straggler, algorithm, op
        self.numel, self.dtype = info.numel, info.dtype
        self._reduce_scatter = REDUCE_SCATTER_ALGORITHMS[reduce_scatter]
        self._chunks = block_offsets(self.numel, max(comm.size - 1, 1))
        self.reduce_scatter_s = float("nan")
        self._steps: list = []
        self._schedule, self._plan = schedule, None
        if algorithm == "stragglar" and schedule is not None:
            self._steps = _my_steps(schedule, comm.rank, self._chunks)
        elif algorithm == "stragglar" and comm.size > 1:
            self._plan = shared_plan(comm.control, comm.size)
            self._steps = rank_steps(self._plan, straggler, comm.rank, self._chunks)
        # The rounds over chunks of whole blocks of a codec (compressed calls), by block size.
        self._block_steps: dict[int, tuple[list[tuple[int, int]], list]] = {}
        raw = comm.control.Split(MPI.UNDEFINED if comm.rank == straggler else 0, comm.rank)
        # mpi4py's stub types Split as returning a Comm; an Intracomm's gives an Intracomm.
        self.peers = None if raw == MPI.COMM_NULL else Communicator(raw)  # type: ignore[arg-type]
        if raw != MPI.COMM_NULL:
            raw.Free()

    def __call__(self, data: BufferT, *, check: bool = True, compressor: Compressor | None = None) -> BufferT:
        """Reduce ``data`` (shaped like the template) over all ranks, in place.

        Args:
            check: on the non-stragglers, agree among themselves on the
                buffer before their pre-phase; every rank checks ``data``
                against the template in any case.
            compressor: a float32 buffer's compressed stream
                (:class:`~collectives.compression.allreduce.Compressor`):
                StragglAR's rounds with every message encoded
                (:func:`~collectives.stragglar.compressed.compressed_stragglar`;
                ``"stragglar"`` only, on chunks of whole blocks of its codec).

        Returns:
            ``data``.
        """
        info = describe(data)
        problem = info.problem or (
            None
            if (info.numel, info.dtype) == (self.numel, self.dtype)
            else f"data must have {self.numel} elements of {self.dtype} like the template, "
            f"got {info.numel} of {info.dtype}"
        )
        if self.peers is not None and check:
            agree(self.peers, self.algorithm, problem, info.error, numel=info.numel, dtype=info.dtype)
        elif problem:
            raise info.error(f"{self.algorithm}: {problem}")
        if self.comm.size == 1:
            return data
        if compressor is not None:
            self._compressed(data, compressor)
            return data
        with self.comm.open_buffer(data) as buf:
            if self.algorithm == "stragglar":
                self._stragglar(buf)
            else:
                self._broadcast(buf)
        return data

    def _compressed(self, data, compressor):
        if self.algorithm != "stragglar":
            raise ValueError(f"compressed messages run StragglAR's rounds only, not {self.algorithm!r}")
        block = compressor.codec.block
        if block not in self._block_steps:
            bounds = chunk_bounds(self.numel, self.comm.size - 1, block)
            chunks = [lo for lo, _ in bounds] + [self.numel]
            steps = (
                _my_steps(self._schedule, self.comm.rank, chunks)
                if self._schedule is not None
                else rank_steps(self._plan, self.straggler, self.comm.rank, chunks)
            )
            self._block_steps[block] = (bounds, steps)
        bounds, steps = self._block_steps[block]
        with self.comm.open_buffer(data) as buf:
            array = float32_on_host(buf.host_array(), "the buffer")
            reduce_scatter_s = compressed_stragglar(
                self.comm, self.peers, steps, bounds, array, compressor, self._scale(), self.straggler
            )
            if self.peers is not None:
                self.reduce_scatter_s = reduce_scatter_s

    def _scale(self):
        return 1.0 / self.comm.size if self.op == "avg" else None

    def _stragglar(self, buf):
        """ReduceScatter among the non-stragglers, then the schedule's rounds."""
        if self.peers is not None:
            started = time.perf_counter()
            self._reduce_scatter(buf, self.peers)
            self.reduce_scatter_s = time.perf_counter() - started
        scale = self._scale()
        scratch = buf.scratch(self._chunks[1] - self._chunks[0])
        nothing = buf.msg(0, 0)
        for send, recv in self._steps:
            out, dst = (buf.msg(send[1], send[2]), send[0]) if send else (nothing, MPI.PROC_NULL)
            into, src = nothing, MPI.PROC_NULL
            if recv:
                src, lo, hi, reduce = recv
                into = scratch.msg(0, hi - lo) if reduce else buf.msg(lo, hi)
            self.comm.exchange(out, dst, into, src, _TAG_ROUNDS)
            if recv and reduce:
                buf.add_(lo, hi, scratch)
                if scale is not None:
                    buf.scale_(lo, hi, scale)

    def _broadcast(self, buf):
        """The Broadcast baseline: the others' Allreduce, a whole-buffer swap
        between the straggler and the first non-straggler, then doubling."""
        n, rank, s = self.comm.size, self.comm.rank, self.straggler
        if self.peers is not None and self.peers.size > 1:
            (rhd_allreduce if self.peers.size & (self.peers.size - 1) == 0 else ring_allreduce)(buf, self.peers)
        # Virtual order: the straggler, then the non-stragglers by rank.
        order = [s] + [r for r in range(n) if r != s]
        me = order.index(rank)
        whole = buf.msg(0, buf.numel)
        if me < 2:
            scratch = buf.scratch(buf.numel)
            self.comm.exchange(whole, order[1 - me], scratch.msg(0, buf.numel), order[1 - me], _TAG_BROADCAST)
            buf.add_(0, buf.numel, scratch)
            scale = self._scale()
            if scale is not None:
                buf.scale_(0, buf.numel, scale)
        span = 2
        while span < n:
            if me < span and me + span < n:
                self.comm.send(whole, order[me + span], _TAG_BROADCAST)
            elif span <= me < 2 * span:
                self.comm.recv(whole, order[me - span], _TAG_BROADCAST)
            span *= 2

    def close(self) -> None:
        """Free the non-stragglers' communicator (collective over them)."""
        if self.peers is not None:
            self.peers.close()
            self.peers = None

    def __enter__(self) -> "Self":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"StragglerAwareAllreduce({self.algorithm}, n={self.comm.size}, "
            f"straggler={self.straggler}, {self.numel} x {self.dtype}, op={self.op})"
        )


def stragglar_allreduce(data: BufferT, *, comm: Communicator, straggler: int, op: Op = "sum") -> BufferT:
    """One StragglAR allreduce of ``data`` in place, planning and freeing the
    plan around it (collective, a communicator split each time): use
    :class:`StragglerAwareAllreduce` for repeated calls."""
    with StragglerAwareAllreduce(comm, straggler, data, op=op) as plan:
        return plan(data)


def _rank_problem(straggler, size):
    if isinstance(straggler, (int, np.integer)) and not isinstance(straggler, bool) and 0 <= straggler < size:
        return None
    return f"straggler must be a rank in range({size}), got {straggler!r}"


def _schedule_problem(schedule, n, straggler):
    """Why a given schedule cannot run here (verified on every rank), or None."""
    if (schedule.n, schedule.straggler) != (n, straggler):
        return (
            f"schedule is for n={schedule.n}, straggler={schedule.straggler}; "
            f"this communicator needs n={n}, straggler={straggler}"
        )
    try:
        verify(schedule)
    except ValueError as exc:
        return str(exc)
    return None


def _my_steps(schedule, rank, chunks):
    """This rank's part of each round: ``(send, recv)``, where ``send`` is
    ``(dst, lo, hi)`` and ``recv`` is ``(src, lo, hi, reduce)`` in elements,
    each None when the rank does not send or receive; rounds in which it does
    neither are left out.  Chunk c is elements ``[chunks[c], chunks[c + 1])``:
    :func:`~collectives.schedules.partition.block_offsets` cuts any element count into
    n - 1 chunks whose sizes differ by at most one, which is what padding to
    a multiple of n - 1 would achieve, without copying the buffer."""
    steps = []
    for transfers in schedule.rounds:
        send = recv = None
        for t in transfers:
            lo, hi = chunks[t.chunk], chunks[t.chunk + 1]
            if t.src == rank:
                send = (t.dst, lo, hi)
            if t.dst == rank:
                recv = (t.src, lo, hi, t.reduce)
        if send or recv:
            steps.append((send, recv))
    return steps
