"""What a float32 buffer looks like on the wire: bf16, fp16, or int8 with a scale per block."""

from __future__ import annotations

from typing import Literal, get_args

import numpy as np

__all__ = ["BLOCK", "CODECS", "BF16", "Codec", "CompressionName", "FP16", "Int8Blocks", "codec_of"]

#: The values of the ``compression`` options: ``"none"`` (float32 on the
#: wire, the schedules' own) or a codec of :data:`CODECS`.
CompressionName = Literal["none", "bf16", "fp16", "int8"]

#: Elements per int8 scale, 4 bytes of scale per 256 one-byte values
#: (1.6 % of the payload), few enough that one large element costs the
#: precision of its own block only.
BLOCK = 256


class Codec:
    """Encodes float32 values into bytes and decodes them back.

    ``encode(x, out)`` writes ``wire_nbytes(x.size)`` bytes; ``decode(wire,
    out)`` writes ``out.size`` float32 values.  Chunks of a buffer that are
    encoded apart must start at multiples of :attr:`block` (int8's scales
    are per block).  Decoding is deterministic, so every rank that decodes
    the same bytes gets the same floats.
    """

    #: The name of the ``compression`` option.
    name: str = ""
    #: Chunk boundaries must be multiples of this.
    block: int = 1

    def wire_nbytes(self, numel: int) -> int:
        raise NotImplementedError

    def encode(self, x: np.ndarray, out: np.ndarray) -> None:
        raise NotImplementedError

    def decode(self, wire: np.ndarray, out: np.ndarray) -> None:
        raise NotImplementedError


class BF16(Codec):
    """bfloat16: float32's upper 16 bits, rounded to nearest even (as
    torch's ``.to(torch.bfloat16)``); NaN stays NaN.  Exact for values
    that are bf16 already; otherwise a relative error of at most 2**-8."""

    name = "bf16"

    def wire_nbytes(self, numel: int) -> int:
        return 2 * numel

    def encode(self, x: np.ndarray, out: np.ndarray) -> None:
        bits = x.view(np.uint32)
        rounded = bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))
        halves = out.view(np.uint16)
        np.right_shift(rounded, np.uint32(16), out=halves, casting="unsafe")
        nan = np.isnan(x)
        if nan.any():
            halves[nan] = 0x7FC0

    def decode(self, wire: np.ndarray, out: np.ndarray) -> None:
        np.left_shift(wire.view(np.uint16).astype(np.uint32), np.uint32(16), out=out.view(np.uint32))


class FP16(Codec):
    """IEEE half precision (numpy's cast, rounding to nearest even):
    exact for fp16 values, a relative error of at most 2**-11 in its
    normal range, and infinite beyond 65504."""

    name = "fp16"

    def wire_nbytes(self, numel: int) -> int:
        return 2 * numel

    def encode(self, x: np.ndarray, out: np.ndarray) -> None:
        with np.errstate(over="ignore"):
            np.copyto(out.view(np.float16), x, casting="unsafe")

    def decode(self, wire: np.ndarray, out: np.ndarray) -> None:
        np.copyto(out, wire.view(np.float16))


class Int8Blocks(Codec):
    """int8 with one float32 scale per :data:`BLOCK` elements (absmax): a
    block of largest magnitude m travels as ``rint(x * 127 / m)`` and
    decodes as ``q * (m / 127)``, an error of at most m / 254 per element.
    The wire holds the block scales, then the values.  Finite inputs only."""

    name = "int8"
    block = BLOCK

    def wire_nbytes(self, numel: int) -> int:
        return 4 * (-(-numel // BLOCK)) + numel

    def _split(self, wire: np.ndarray, numel: int) -> tuple[np.ndarray, np.ndarray]:
        blocks = -(-numel // BLOCK)
        return wire[: 4 * blocks].view(np.float32), wire[4 * blocks : 4 * blocks + numel].view(np.int8)

    @staticmethod
    def _blocks(a: np.ndarray) -> list[np.ndarray]:
        """``a`` as a [blocks, BLOCK] view and its short last block, if any."""
        full = a.size // BLOCK * BLOCK
        parts = [a[:full].reshape(-1, BLOCK)]
        if full < a.size:
            parts.append(a[full:].reshape(1, -1))
        return parts

    def encode(self, x: np.ndarray, out: np.ndarray) -> None:
        scales, q = self._split(out, x.size)
        first = 0
        for values, codes in zip(self._blocks(x), self._blocks(q)):
            scale = np.abs(values).max(axis=1) / np.float32(127)
            scales[first : first + scale.size] = scale
            first += scale.size
            inverse = np.divide(np.float32(1), scale, out=np.zeros_like(scale), where=scale > 0)
            codes[:] = np.rint(values * inverse[:, None])

    def decode(self, wire: np.ndarray, out: np.ndarray) -> None:
        scales, q = self._split(wire, out.size)
        first = 0
        for codes, values in zip(self._blocks(q), self._blocks(out)):
            count = codes.shape[0]
            np.multiply(codes, scales[first : first + count, None], out=values)
            first += count


#: The codecs by the name of the ``compression`` option.
CODECS: dict[str, Codec] = {codec.name: codec for codec in (BF16(), FP16(), Int8Blocks())}


def codec_of(compression: str) -> Codec | None:
    """The codec named ``compression``; None for ``"none"``."""
    if compression == "none":
        return None
    if compression not in CODECS:
        raise ValueError(
            f"compression must be one of {', '.join(map(repr, get_args(CompressionName)))}, got {compression!r}"
        )
    return CODECS[compression]
