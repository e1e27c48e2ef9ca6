"""The compressed allreduce: each contribution encoded once, the sums kept in float32, error feedback."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from mpi4py import MPI

from ..buffers import BufferT, FlatBuffer
from .codecs import Codec, Int8Blocks, codec_of

if TYPE_CHECKING:
    from ..comm import Communicator
    from ..schedules.blocking import Op
    from ..wait_avoiding.group_library import GroupCommunicators
    from ..wait_avoiding.groups import GroupPlan

__all__ = [
    "Compressor",
    "chunk_bounds",
    "compressed_allreduce",
    "compressed_group_schedule",
    "compressed_reduce_scatter",
    "compressor_for",
    "encode_with_feedback",
    "float32_on_host",
    "host_view",
]


def chunk_bounds(numel: int, ranks: int, block: int) -> list[tuple[int, int]]:
    """Element ranges ``[lo, hi)`` of the ``ranks`` chunks of a buffer of
    ``numel``: whole blocks of ``block`` elements, dealt as evenly as they go
    (some may be empty)."""
    blocks = -(-numel // block)
    edges = [min(numel, (j * blocks // ranks) * block) for j in range(ranks + 1)]
    return list(zip(edges, edges[1:]))


class Compressor:
    """One stream of compressed allreduces: its codec, its error feedback and the bytes it sent.

    With ``error_feedback`` (int8's), what encoding loses is carried to
    the next call instead of lost (Seide et al., 2014; Karimireddy et al.,
    2019): this rank's contribution x is sent as ``encode(x + e)`` and
    ``e`` becomes ``x + e - decode(...)``; the chunk of the sum this rank
    reduces is sent back the same way with a residual of its own
    (:attr:`owner_residual`, elementwise over the buffer, so that any chunk a
    later group gives this rank carries what was lost of those elements).
    Over calls nothing is lost: the sum of every result equals the sum of
    every input minus the residuals left, up to float32 rounding of the
    additions (tested).

    A stream is one buffer averaged again and again (a model, a gradient
    bucket, a fragment): its residuals belong to it.  Used by one thread at
    a time.

    Args:
        codec: the wire format (:data:`~collectives.compression.codecs.CODECS`).
        numel: the elements of the stream's buffer.
        error_feedback: carry the residuals.
    """

    def __init__(self, codec: Codec, numel: int, *, error_feedback: bool) -> None:
        self.codec, self.numel = codec, numel
        #: This rank's contribution residual e (None without error feedback).
        self.residual = np.zeros(numel, np.float32) if error_feedback else None
        #: The residual of the chunks of sums this rank reduced, per element.
        self.owner_residual = np.zeros(numel, np.float32) if error_feedback else None
        #: The bytes this rank handed to MPI for the stream so far, what it
        #: sent in the all-to-all and its chunk once per other rank for the
        #: allgather (as a direct exchange sends it).
        self.bytes_sent = 0

    def __repr__(self) -> str:
        feedback = ", error feedback" if self.residual is not None else ""
        return f"Compressor({self.codec.name}, {self.numel} elements{feedback})"


def compressor_for(compression: str, numel: int) -> Compressor | None:
    """The :class:`Compressor` of a stream of ``numel`` elements for the
    ``compression`` option (None for ``"none"``); int8 carries error feedback."""
    codec = codec_of(compression)
    if codec is None:
        return None
    return Compressor(codec, numel, error_feedback=isinstance(codec, Int8Blocks))


def encode_with_feedback(
    codec: Codec, x: np.ndarray, residual: np.ndarray | None = None, out: np.ndarray | None = None
) -> np.ndarray:
    """``x`` plus ``residual`` (a stream's residual, or None) encoded; returns
    the bytes.  ``residual``, where given, becomes what the encoding lost of
    ``x + residual``; ``out``, where given, what the bytes decode to (``x``
    itself for a sender that keeps what every receiver gets)."""
    value = x if residual is None else x + residual
    wire = np.empty(codec.wire_nbytes(value.size), np.uint8)
    codec.encode(value, wire)
    if residual is not None or out is not None:
        decoded = np.empty_like(value) if out is None else out
        codec.decode(wire, decoded)
        if residual is not None:
            np.subtract(value, decoded, out=residual)
    return wire


def float32_on_host(array: np.ndarray | None, what: str) -> np.ndarray:
    """``array`` (a buffer's elements on the host, None for device memory)
    flat, or the error that compressed averaging cannot take it."""
    if array is None:
        raise RuntimeError(
            f"compressed averaging encodes on the host: {what} is in device memory under a CUDA-aware MPI "
            f"(set COLLECTIVES_CUDA_AWARE=0 to stage it through the host)"
        )
    if array.dtype != np.float32:
        raise TypeError(f"compressed averaging needs float32 buffers, got {array.dtype}")
    return array.reshape(-1)


def host_view(data: object, what: str = "the buffer") -> np.ndarray:
    """A float32 buffer's elements as a numpy array over its memory (a numpy
    array itself, a CPU tensor's ``.numpy()``): what compressed averaging
    encodes and decodes."""
    if isinstance(data, np.ndarray):
        return float32_on_host(data, what)
    return float32_on_host(data.numpy() if getattr(data, "is_cuda", True) is False else None, what)  # type: ignore[attr-defined]


def compressed_reduce_scatter(
    comm: MPI.Intracomm, x: np.ndarray, compressor: Compressor, bounds: list[tuple[int, int]]
) -> np.ndarray:
    """Step 1 and the sum of step 2 of :func:`compressed_allreduce_array`:
    this rank's contribution ``x`` (plus its residual) encoded once, chunk j
    (``bounds[j]``, whole blocks) to rank j, and the float32 sum, in rank
    order, of the chunks this rank receives: returned, the sum over ``comm``
    of chunk ``comm.rank``."""
    ranks, me = comm.Get_size(), comm.Get_rank()
    codec = compressor.codec
    counts = [codec.wire_nbytes(hi - lo) for lo, hi in bounds]
    displacements = np.concatenate([[0], np.cumsum(counts)[:-1]]).tolist()
    residual = compressor.residual
    send = np.concatenate(
        [encode_with_feedback(codec, x[lo:hi], None if residual is None else residual[lo:hi]) for lo, hi in bounds]
    )
    lo, hi = bounds[me]
    mine = counts[me]
    received = np.empty(ranks * mine, np.uint8)
    comm.Alltoallv(
        [send, (counts, displacements), MPI.BYTE],
        [received, ([mine] * ranks, [i * mine for i in range(ranks)]), MPI.BYTE],
    )
    total, part = np.zeros(hi - lo, np.float32), np.empty(hi - lo, np.float32)
    for i in range(ranks):
        codec.decode(received[i * mine : (i + 1) * mine], part)
        total += part
    compressor.bytes_sent += sum(counts) - mine
    return total


def compressed_allreduce_array(
    comm: MPI.Intracomm,
    array: np.ndarray,
    compressor: Compressor,
    scale: float | None = None,
    src: np.ndarray | None = None,
) -> None:
    """The sum (times ``scale``) over ``comm`` of every rank's float32
    ``src`` (default ``array``) into ``array``, through ``compressor``'s codec.

    1. Each rank adds its residual, encodes its buffer once, in one chunk
       per rank (:func:`chunk_bounds`), and sends chunk j to rank j
       (``MPI_Alltoallv``): a ReduceScatter in which nothing is re-encoded.
    2. Rank j decodes the ranks' chunks and adds them in float32, in rank
       order, then scales, adds its owner residual and encodes the result once.
    3. ``MPI_Allgatherv`` of the encoded chunks; every rank decodes every
       chunk, so every rank ends with the same floats, bit for bit.

    Each rank sends about 2 (P - 1) / P of the encoded buffer, as a
    bandwidth-optimal allreduce of float32 sends of the buffer itself; each
    value is encoded twice (its contribution, its reduced chunk), whatever
    P.  On one rank nothing is encoded: ``array`` is ``src`` times ``scale``.
    """
    ranks, me = comm.Get_size(), comm.Get_rank()
    x = array if src is None else src
    if ranks == 1:
        if src is not None:
            np.copyto(array, src)
        if scale is not None:
            np.multiply(array, scale, out=array)
        return
    codec = compressor.codec
    bounds = chunk_bounds(x.size, ranks, codec.block)
    counts = [codec.wire_nbytes(hi - lo) for lo, hi in bounds]
    displacements = np.concatenate([[0], np.cumsum(counts)[:-1]]).tolist()
    lo, hi = bounds[me]
    mine = counts[me]
    total = compressed_reduce_scatter(comm, x, compressor, bounds)
    if scale is not None:
        total *= np.float32(scale)
    owner = compressor.owner_residual
    reduced = encode_with_feedback(codec, total, None if owner is None else owner[lo:hi])
    gathered = np.empty(sum(counts), np.uint8)
    comm.Allgatherv([reduced, MPI.BYTE], [gathered, (counts, displacements), MPI.BYTE])
    for (first, last), count, at in zip(bounds, counts, displacements):
        codec.decode(gathered[at : at + count], array[first:last])
    compressor.bytes_sent += (ranks - 1) * mine


def compressed_allreduce(data: BufferT, *, comm: Communicator, compressor: Compressor, op: Op = "sum") -> BufferT:
    """The allreduce of ``data`` (float32, host or staged) over ``comm``
    through ``compressor`` (:func:`compressed_allreduce_array`); ``op="avg"``
    scales each reduced chunk by 1 / P before it is encoded.  Every rank
    calls it with its stream's compressor; the arguments are not agreed
    (the caller made the compressors alike on every rank)."""
    with comm.open_buffer(data) as buf:
        compressed_allreduce_array(
            comm.data,
            float32_on_host(buf.host_array(), "the buffer"),
            compressor,
            1.0 / comm.size if op == "avg" else None,
        )
    return data


def compressed_group_schedule(
    groups: GroupCommunicators,
    compressor: Compressor,
    buf: FlatBuffer,
    comm: Communicator,
    plan: GroupPlan,
    scale: float | None = None,
    tag: int = 0,
    src: FlatBuffer | None = None,
) -> None:
    """The group allreduces' schedule signature once ``groups`` and
    ``compressor`` are bound: :func:`compressed_allreduce_array` on the
    communicator of ``plan``'s group (``comm`` and ``tag`` unused), as
    the library's schedule runs ``MPI_Allreduce`` there
    (:func:`~collectives.wait_avoiding.group_allreduce.library_schedule`:
    blocking collectives, whichever thread of a member runs the version)."""
    compressed_allreduce_array(
        groups.communicator(plan.members),
        float32_on_host(buf.host_array(), "the buffer"),
        compressor,
        scale,
        None if src is None else float32_on_host(src.host_array(), "the contribution"),
    )
