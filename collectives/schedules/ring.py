"""Ring ReduceScatter, Allgather and Allreduce on point-to-point messages."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .partition import block_offsets

if TYPE_CHECKING:
    from ..buffers import FlatBuffer
    from ..comm import Communicator

__all__ = ["ring_allgather", "ring_allreduce", "ring_reduce_scatter"]

# Tags on the data channel.  Each call is blocking and every rank runs the
# same steps in the same order, and MPI does not let two messages between one
# pair of ranks on one communicator and tag overtake each other, so one tag
# per phase suffices.
_TAG_REDUCE_SCATTER = 11
_TAG_ALLGATHER = 12


def ring_reduce_scatter(buf: FlatBuffer, comm: Communicator, scale: float | None = None) -> None:
    """Leave block ``rank`` of ``buf`` reduced over all ranks (in place).

    p - 1 steps; in step s rank r sends block (r - s - 1) mod p to r + 1 and
    adds block (r - s - 2) mod p received from r - 1 into its own copy, so
    that in the last step it receives its own block r.  Every rank sends and
    receives (p - 1)/p of the buffer; other blocks are left holding partial
    sums.  ``scale`` multiplies the finished block (averaging).
    """
    p, r = comm.size, comm.rank
    off = block_offsets(buf.numel, p)
    if p > 1:
        right, left = (r + 1) % p, (r - 1) % p
        scratch = buf.scratch(off[1] - off[0])
        for s in range(p - 1):
            out, into = (r - s - 1) % p, (r - s - 2) % p
            lo, hi = off[into], off[into + 1]
            comm.exchange(buf.msg(off[out], off[out + 1]), right, scratch.msg(0, hi - lo), left, _TAG_REDUCE_SCATTER)
            buf.add_(lo, hi, scratch)
    if scale is not None:
        buf.scale_(off[r], off[r + 1], scale)


def ring_allgather(buf: FlatBuffer, comm: Communicator) -> None:
    """Copy block ``rank`` of ``buf`` to every rank (in place).

    p - 1 steps; in step s rank r forwards block (r - s) mod p to r + 1 and
    receives block (r - s - 1) mod p from r - 1 straight into ``buf``.
    """
    p, r = comm.size, comm.rank
    off = block_offsets(buf.numel, p)
    right, left = (r + 1) % p, (r - 1) % p
    for s in range(p - 1):
        out, into = (r - s) % p, (r - s - 1) % p
        comm.exchange(buf.msg(off[out], off[out + 1]), right, buf.msg(off[into], off[into + 1]), left, _TAG_ALLGATHER)


def ring_allreduce(buf: FlatBuffer, comm: Communicator, scale: float | None = None) -> None:
    """Ring Allreduce: ring ReduceScatter, then ring Allgather.

    2(p - 1) steps, each rank sending 2(p - 1)/p of the buffer: the
    bandwidth-optimal schedule for any p.  Each block is reduced once, on its
    owner, and then copied, so every rank ends with bitwise equal results.
    """
    ring_reduce_scatter(buf, comm, scale)
    ring_allgather(buf, comm)
