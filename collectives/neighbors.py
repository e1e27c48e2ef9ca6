"""Sums over fixed neighbours: the communication of gossip and decentralized SGD."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from .agreement import check_arguments
from .buffers import BufferT, describe
from .compression.allreduce import Compressor, encode_with_feedback, host_view
from .failures import waitall

if TYPE_CHECKING:
    from .comm import Communicator

__all__ = ["neighbor_sum"]

_TAG_NEIGHBORS = 41


def neighbor_sum(
    data: BufferT,
    *,
    comm: Communicator,
    offsets: Sequence[int] = (-1, 1),
    check: bool = True,
    compressor: Compressor | None = None,
) -> BufferT:
    """Add to ``data`` the ``data`` of ranks ``(rank + o) mod P``, o in ``offsets``.

    Every rank sends its unmodified ``data`` to each ``(rank - o) mod P`` and
    receives from each ``(rank + o) mod P`` (one message per offset, all
    posted before any is waited for), then adds what it received, in the
    order of ``offsets``.  ``offsets=(-1, 1)`` on a ring gives the sum of a
    rank and its two neighbours (D-PSGD's mixing with weights 1/3 after
    scaling).  An offset that is 0 mod P adds the rank's own data again; with
    P = 2 both ring neighbours are the other rank, which is then added twice.

    Args:
        data: as for :func:`~collectives.schedules.blocking.allreduce`.
        comm: a :class:`~collectives.comm.Communicator`.
        offsets: the same non-empty sequence of ints on every rank.
        check: agree on the arguments across ranks first.
        compressor: a float32 buffer's compressed stream
            (:class:`~collectives.compression.allreduce.Compressor`): the
            rank's data goes out encoded once (with its residual, which
            keeps what the encoding lost for the next call), what arrives is
            decoded and added in float32; the rank's own data is added as it is.
    """
    info = describe(data)
    offsets = tuple(offsets)
    problem = info.problem or (
        None
        if offsets and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
        else f"offsets must be a non-empty sequence of ints, got {offsets!r}"
    )
    check_arguments(
        comm, "neighbor_sum", problem, info.error, check, numel=info.numel, dtype=info.dtype, offsets=offsets
    )
    p, r = comm.size, comm.rank
    if compressor is not None:
        _compressed_neighbor_sum(host_view(data), comm, offsets, compressor)
        return data
    with comm.open_buffer(data) as buf:
        n = buf.numel
        scratch = buf.scratch(n * len(offsets))
        requests = []
        for k, o in enumerate(offsets):
            requests.append(comm.data.Irecv(scratch.msg(k * n, (k + 1) * n), (r + o) % p, _TAG_NEIGHBORS + k))
            requests.append(comm.isend(buf.msg(0, n), (r - o) % p, _TAG_NEIGHBORS + k))
        waitall(requests)
        for k in range(len(offsets)):
            buf.add_(0, n, scratch, at=k * n)
    return data


def _compressed_neighbor_sum(x, comm, offsets, compressor):
    """:func:`neighbor_sum` with ``compressor``: one encoding, sent to every
    out-neighbour; the decoded in-neighbours' data added in offsets' order."""
    p, r = comm.size, comm.rank
    wire = encode_with_feedback(compressor.codec, x, compressor.residual)
    incoming = [np.empty_like(wire) for _ in offsets]
    requests = []
    for k, o in enumerate(offsets):
        requests.append(comm.data.Irecv(incoming[k], (r + o) % p, _TAG_NEIGHBORS + k))
        requests.append(comm.isend(wire, (r - o) % p, _TAG_NEIGHBORS + k))
    waitall(requests)
    part = np.empty_like(x)
    for received in incoming:
        compressor.codec.decode(received, part)
        x += part
    compressor.bytes_sent += len(offsets) * wire.size
