"""StragglAR with compressed messages: the same rounds, each chunk encoded where its value is made."""

from __future__ import annotations

import time

import numpy as np

from ..comm import Communicator
from ..compression.allreduce import Compressor, compressed_reduce_scatter, encode_with_feedback

__all__ = ["compressed_stragglar"]

# The data channel's tag of the rounds (the runtime's own rounds use 31).
_TAG_COMPRESSED_ROUNDS = 33


def compressed_stragglar(
    comm: Communicator,
    peers: Communicator | None,
    steps: list,
    bounds: list[tuple[int, int]],
    x: np.ndarray,
    compressor: Compressor,
    scale: float | None,
    straggler: int,
) -> float:
    """StragglAR's allreduce of the float32 ``x`` over ``comm`` (in place),
    every message through ``compressor``'s codec, sums in float32.

    The non-stragglers (``peers``) reduce-scatter their contributions as the
    compressed allreduce does (each encoded once, chunk g summed in float32
    on peer g; ``bounds``, whole blocks, are the chunks), then every rank
    runs the schedule's rounds (``steps``, the runtime's ``(send, recv)``
    per round for these chunks).  A chunk is encoded where its value is
    made, and forwarded as the bytes it arrived as:

    * the straggler's own chunk, and a peer's partial sum, are encoded with
      error feedback (the contribution's residual, the owner's residual) the
      first time they are sent, and the sender keeps what it sent, decoded;
    * the round that adds the straggler's chunk to the peers' partial sum
      (both partners add, in either order: float addition commutes, and both
      add the same two decoded values) makes the final value, scaled and
      encoded once without feedback, so that both partners hold, and later
      send, the same bytes; the non-straggler of the pair carries what that
      encoding lost in its owner residual (in units of the sum), so that it
      goes into its next partial sum of the chunk;
    * a copied chunk is kept as it arrived and sent on as those bytes.

    So every rank ends with the same floats, and over calls nothing is lost:
    each result is the inputs' sum plus the residuals carried in minus
    those carried out, as in :func:`~collectives.compression.allreduce.compressed_allreduce_array`.
    Returns the seconds of the peers' ReduceScatter (NaN on the straggler).
    """
    codec = compressor.codec
    chunks = list(bounds)  # (lo, hi): an empty chunk may start where the next one does
    reduce_scatter_s = float("nan")
    if peers is not None:
        entered = time.perf_counter()
        mine = bounds[peers.rank]
        x[mine[0] : mine[1]] = compressed_reduce_scatter(peers.data, x, compressor, bounds)
        reduce_scatter_s = time.perf_counter() - entered
    wires: dict[tuple[int, int], np.ndarray] = {}  # chunk -> the bytes its value travels as
    raw = set(chunks) if comm.rank == straggler else set()  # chunks holding this rank's own contribution
    nothing = np.empty(0, np.uint8)
    for send, recv in steps:
        out, dst = nothing, -1
        if send:
            dst, lo, hi = send
            known = wires.get((lo, hi))
            out = _encode_made_here(codec, x, lo, hi, compressor, raw) if known is None else known
            wires[lo, hi] = out
            compressor.bytes_sent += out.size
        into = nothing
        if recv:
            src, lo, hi, reduce = recv
            into = np.empty(codec.wire_nbytes(hi - lo), np.uint8)
        comm.exchange(out, dst, into, src if recv else -1, _TAG_COMPRESSED_ROUNDS)
        if not recv:
            continue
        part = np.empty(hi - lo, np.float32)
        codec.decode(into, part)
        if not reduce:
            x[lo:hi], wires[lo, hi] = part, into
            raw.discard((lo, hi))
            continue
        total = x[lo:hi] + part
        if scale is not None:
            total *= np.float32(scale)
        wires[lo, hi] = encode_with_feedback(codec, total, out=x[lo:hi])
        raw.discard((lo, hi))
        swapped = bool(send) and send[1:] == (lo, hi)
        if compressor.owner_residual is not None and (comm.rank != straggler or not swapped):
            lost = total - x[lo:hi]
            compressor.owner_residual[lo:hi] += lost if scale is None else lost / np.float32(scale)
    return reduce_scatter_s


def _encode_made_here(codec, x, lo, hi, compressor, raw):
    """The bytes of a chunk whose value this rank made (its own contribution,
    or a partial sum): encoded with the matching residual, and ``x`` set to
    what it decodes to."""
    residual = compressor.residual if (lo, hi) in raw else compressor.owner_residual
    return encode_with_feedback(codec, x[lo:hi], None if residual is None else residual[lo:hi], out=x[lo:hi])
