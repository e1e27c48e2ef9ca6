"""Compressed averaging: bf16, fp16 or int8 with per-block scales and error feedback on the wire, float32 sums.

:mod:`~collectives.compression.codecs` says how a float32 buffer travels,
:mod:`~collectives.compression.allreduce` how a compressed allreduce moves it
(each contribution encoded once, the sums in float32) and how error feedback
keeps what encoding loses.
"""

from .allreduce import Compressor, compressed_allreduce, compressed_group_schedule, compressor_for
from .codecs import CODECS, CompressionName, codec_of

__all__ = [
    "CODECS",
    "CompressionName",
    "Compressor",
    "codec_of",
    "compressed_allreduce",
    "compressed_group_schedule",
    "compressor_for",
]
