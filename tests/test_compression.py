"""The wire formats of compressed averaging: bf16 and fp16 as torch and numpy round, int8's per-block bound."""

import numpy as np
import pytest
import torch

from collectives.compression.allreduce import chunk_bounds
from collectives.compression.codecs import BLOCK, CODECS, CompressionName, codec_of

RNG = np.random.default_rng(0)


def _round_trip(name, x):
    codec = CODECS[name]
    wire = np.empty(codec.wire_nbytes(x.size), np.uint8)
    codec.encode(x, wire)
    out = np.empty_like(x)
    codec.decode(wire, out)
    return out


def test_bf16_rounds_as_torch_does_specials_included():
    x = np.concatenate(
        [
            RNG.standard_normal(5000).astype(np.float32) * 10.0 ** RNG.integers(-30, 30, 5000),
            np.array([0.0, -0.0, np.inf, -np.inf, 3.4028235e38, 1e-45, -1e-40, 1.00390625, 1.01171875], np.float32),
        ]
    ).astype(np.float32)
    expected = torch.from_numpy(x).to(torch.bfloat16).float().numpy()
    assert np.array_equal(_round_trip("bf16", x), expected)
    assert np.isnan(_round_trip("bf16", np.array([np.nan, -np.nan], np.float32))).all()


def test_fp16_rounds_as_numpy_does():
    x = (RNG.standard_normal(4000) * 100).astype(np.float32)
    assert np.array_equal(_round_trip("fp16", x), x.astype(np.float16).astype(np.float32))


def test_values_of_the_wire_format_travel_exactly():
    small = RNG.integers(-200, 200, 3000).astype(np.float32)  # integers below 256: bf16 and fp16 hold them
    assert np.array_equal(_round_trip("bf16", small), small)
    assert np.array_equal(_round_trip("fp16", small), small)
    codes = RNG.integers(-127, 128, 3 * BLOCK).astype(np.float32)
    codes[::BLOCK] = 127  # each block's absmax is 127: scale 1, every code exact
    assert np.array_equal(_round_trip("int8", codes), codes)


@pytest.mark.parametrize("numel", [1, BLOCK - 1, BLOCK, 3 * BLOCK + 17])
def test_int8_errs_at_most_half_a_step_of_its_block(numel):
    x = (RNG.standard_normal(numel) * 10.0 ** RNG.integers(-3, 3, numel)).astype(np.float32)
    x[: min(numel, 5)] = 0.0
    out = _round_trip("int8", x)
    for first in range(0, numel, BLOCK):
        block = slice(first, first + BLOCK)
        step = np.abs(x[block]).max() / 127
        # rint leaves at most half a step, and the float32 arithmetic of x * 127 / m and q * m / 127 a few ulps.
        assert np.all(np.abs(out[block] - x[block]) <= step / 2 * (1 + 1e-5) + 4 * np.spacing(np.abs(x[block])))
    assert CODECS["int8"].wire_nbytes(numel) == numel + 4 * (-(-numel // BLOCK))


def test_an_all_zero_block_decodes_to_zeros():
    assert np.array_equal(_round_trip("int8", np.zeros(2 * BLOCK + 3, np.float32)), np.zeros(2 * BLOCK + 3))


@pytest.mark.parametrize("numel, ranks", [(0, 3), (5, 4), (1000, 3), (4096, 8), (10 * BLOCK + 1, 7)])
def test_chunks_cover_the_buffer_in_whole_blocks(numel, ranks):
    bounds = chunk_bounds(numel, ranks, BLOCK)
    assert len(bounds) == ranks and bounds[0][0] == 0 and bounds[-1][1] == numel
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    assert all(lo % BLOCK == 0 for lo, hi in bounds if lo < numel)


def test_an_unknown_compression_names_the_accepted_ones():
    with pytest.raises(ValueError, match=r"compression must be one of 'none', 'bf16', 'fp16', 'int8', got 'fp8'"):
        codec_of("fp8")
    assert codec_of("none") is None and tuple(CODECS) == CompressionName.__args__[1:]
