"""Recursive halving / doubling schedules for any rank count.

The power-of-two core pairs rank v with v ^ mask.  For p that is not a power
of two, the fold of MPICH's Rabenseifner implementation is used: with
p2 = 2**floor(log2 p) and rem = p - p2, the even ranks below 2 rem hand their
data to their odd neighbour and sit out; the p2 survivors run the power-of-two
schedule on virtual ranks; the result is handed back.  A virtual rank stands
for one or two real ranks, and owns their blocks, which are contiguous, so the
halving can still split the buffer into contiguous halves of whole blocks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .partition import block_offsets

if TYPE_CHECKING:
    from ..buffers import FlatBuffer
    from ..comm import Communicator

__all__ = [
    "recursive_doubling_allgather",
    "recursive_doubling_allreduce",
    "recursive_halving_reduce_scatter",
    "rhd_allreduce",
]

# Tags on the data channel, one per phase (see ring.py for why one suffices).
_TAG_FOLD = 21
_TAG_HALVING = 22
_TAG_DOUBLING = 23
_TAG_UNFOLD = 24


class _Fold:
    """The map between real ranks and the p2 virtual ranks of the core.

    Real ranks 2i and 2i + 1 (i < rem) form virtual rank i, represented by
    the odd one; real rank q >= 2 rem is virtual rank q - rem.  ``vrank`` is
    None for the even ranks that sit out.
    """

    def __init__(self, rank: int, size: int):
        self.p2 = 1 << (size.bit_length() - 1)
        self.rem = size - self.p2
        self.vrank: int | None
        self.partner: int | None
        if rank < 2 * self.rem:
            self.vrank = rank // 2 if rank % 2 else None
            self.partner = rank - 1 if rank % 2 else rank + 1
        else:
            self.vrank = rank - self.rem
            self.partner = None

    def real(self, v: int) -> int:
        """The real rank that acts for virtual rank ``v``."""
        return 2 * v + 1 if v < self.rem else v + self.rem

    def virtual_offsets(self, off: list[int]) -> list[int]:
        """Element offsets of the virtual ranks' blocks (length p2 + 1)."""
        first = [2 * v if v < self.rem else v + self.rem for v in range(self.p2)]
        return [off[q] for q in first] + [off[-1]]


def _fold_reduce(buf, comm, fold):
    """Even ranks below 2 rem add their whole buffer into their odd partner's."""
    if fold.partner is None:
        return
    if fold.vrank is None:
        comm.send(buf.msg(0, buf.numel), fold.partner, _TAG_FOLD)
    else:
        scratch = buf.scratch(buf.numel)
        comm.recv(scratch.msg(0, buf.numel), fold.partner, _TAG_FOLD)
        buf.add_(0, buf.numel, scratch)


def _unfold(buf, comm, fold, lo=0, hi=None):
    """Odd ranks below 2 rem send ``buf[lo:hi]`` back to the rank that sat out."""
    if fold.partner is None:
        return
    hi = buf.numel if hi is None else hi
    if fold.vrank is None:
        comm.recv(buf.msg(lo, hi), fold.partner, _TAG_UNFOLD)
    else:
        comm.send(buf.msg(lo, hi), fold.partner, _TAG_UNFOLD)


def _halving(buf, comm, fold, voff):
    """Recursive halving on the virtual ranks; returns the kept window.

    log2 p2 steps with mask = p2/2, ..., 1: the current window of virtual
    blocks is split in two, a rank keeps the half on its side of ``mask``,
    sends the other half to v ^ mask and adds the partner's copy of its own
    half.  Ends with the window ``[vrank, vrank + 1)``, fully reduced.
    """
    v, vlo, vhi = fold.vrank, 0, fold.p2
    scratch = None
    mask = fold.p2 >> 1
    while mask:
        mid = vlo + (vhi - vlo) // 2
        if v & mask:
            (slo, shi), (vlo, vhi) = (vlo, mid), (mid, vhi)
        else:
            (slo, shi), (vlo, vhi) = (mid, vhi), (vlo, mid)
        lo, hi = voff[vlo], voff[vhi]
        if scratch is None:
            scratch = buf.scratch(hi - lo)
        comm.exchange(
            buf.msg(voff[slo], voff[shi]),
            fold.real(v ^ mask),
            scratch.msg(0, hi - lo),
            fold.real(v ^ mask),
            _TAG_HALVING,
        )
        buf.add_(lo, hi, scratch)
        mask >>= 1
    return voff[v], voff[v + 1]


def _doubling(buf, comm, fold, voff):
    """Recursive doubling on the virtual ranks: each step doubles the window.

    log2 p2 steps with mask = 1, 2, ..., p2/2: send the window held so far to
    v ^ mask and receive its window, which is the neighbouring one, in place.
    """
    v = fold.vrank
    mask = 1
    while mask < fold.p2:
        base = v & ~(mask - 1)
        peer = base ^ mask
        comm.exchange(
            buf.msg(voff[base], voff[base + mask]),
            fold.real(v ^ mask),
            buf.msg(voff[peer], voff[peer + mask]),
            fold.real(v ^ mask),
            _TAG_DOUBLING,
        )
        mask <<= 1


def recursive_halving_reduce_scatter(buf: FlatBuffer, comm: Communicator, scale: float | None = None) -> None:
    """Leave block ``rank`` of ``buf`` reduced over all ranks (in place).

    log2 p2 steps of halving (plus the fold for p that is not a power of
    two); each survivor sends and receives (p2 - 1)/p2 of the buffer.
    ``scale`` multiplies the finished block.
    """
    p, r = comm.size, comm.rank
    off = block_offsets(buf.numel, p)
    fold = _Fold(r, p)
    _fold_reduce(buf, comm, fold)
    if fold.vrank is not None:
        lo, hi = _halving(buf, comm, fold, fold.virtual_offsets(off))
        if scale is not None:
            buf.scale_(lo, hi, scale)
    if fold.partner is not None:
        q = min(r, fold.partner)  # the block of the rank that sat out
        _unfold(buf, comm, fold, off[q], off[q + 1])


def recursive_doubling_allgather(buf: FlatBuffer, comm: Communicator) -> None:
    """Copy block ``rank`` of ``buf`` to every rank (in place).

    Ranks that sit out first hand their block to their partner; the survivors
    double their windows log2 p2 times; the full buffer goes back to the
    ranks that sat out.
    """
    p, r = comm.size, comm.rank
    off = block_offsets(buf.numel, p)
    fold = _Fold(r, p)
    if fold.partner is not None:
        q = min(r, fold.partner)  # the even rank's block travels
        if fold.vrank is None:
            comm.send(buf.msg(off[q], off[q + 1]), fold.partner, _TAG_FOLD)
        else:
            comm.recv(buf.msg(off[q], off[q + 1]), fold.partner, _TAG_FOLD)
    if fold.vrank is not None:
        _doubling(buf, comm, fold, fold.virtual_offsets(off))
    _unfold(buf, comm, fold)


def rhd_allreduce(buf: FlatBuffer, comm: Communicator, scale: float | None = None) -> None:
    """Rabenseifner's Allreduce: recursive halving, then recursive doubling.

    2 log2 p2 steps (plus the fold), each survivor sending 2(p2 - 1)/p2 of
    the buffer: bandwidth-optimal like the ring with a logarithmic number of
    messages.  Each block is reduced once and then copied, so every rank ends
    with bitwise equal results.
    """
    fold = _Fold(comm.rank, comm.size)
    _fold_reduce(buf, comm, fold)
    if fold.vrank is not None:
        voff = fold.virtual_offsets(block_offsets(buf.numel, comm.size))
        lo, hi = _halving(buf, comm, fold, voff)
        if scale is not None:
            buf.scale_(lo, hi, scale)
        _doubling(buf, comm, fold, voff)
    _unfold(buf, comm, fold)


def recursive_doubling_allreduce(buf: FlatBuffer, comm: Communicator, scale: float | None = None) -> None:
    """Allreduce by exchanging the whole buffer with v ^ mask, log2 p2 times.

    Latency-optimal (log2 p2 messages) at the price of sending the whole
    buffer each step: the schedule for small buffers.  Both partners compute
    a + b and b + a, which IEEE addition makes bitwise equal, so all ranks
    agree exactly.
    """
    fold = _Fold(comm.rank, comm.size)
    _fold_reduce(buf, comm, fold)
    if fold.vrank is not None:
        scratch = buf.scratch(buf.numel)
        mask = 1
        while mask < fold.p2:
            peer = fold.real(fold.vrank ^ mask)
            comm.exchange(buf.msg(0, buf.numel), peer, scratch.msg(0, buf.numel), peer, _TAG_DOUBLING)
            buf.add_(0, buf.numel, scratch)
            mask <<= 1
        if scale is not None:
            buf.scale_(0, buf.numel, scale)
    _unfold(buf, comm, fold)
