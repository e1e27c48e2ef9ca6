"""The compressed allreduce on real ranks: exact where the wire format holds the values, bounded otherwise,
the same floats on every rank, and error feedback that loses nothing over calls."""

import numpy as np
import pytest
import torch
from mpi4py import MPI

from collectives.comm import Communicator
from collectives.compression import Compressor, compressed_allreduce, compressor_for
from collectives.compression.codecs import CODECS

WORLD = MPI.COMM_WORLD
P, RANK = WORLD.size, WORLD.rank
U = 2.0**-24  # float32's unit roundoff


@pytest.fixture
def comm():
    with Communicator(WORLD) as comm:
        yield comm


def _inputs(numel, seed, scale=1.0):
    """Every rank's input, the same in every process (the test knows them all)."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((P, numel)) * scale * 10.0 ** rng.integers(-2, 2, (P, numel))).astype(np.float32)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("name", ["bf16", "fp16"])
def test_values_and_sums_the_wire_format_holds_arrive_exactly(comm, name):
    # Small integers: every input and every partial sum is bf16 and fp16, so nothing rounds.
    x = np.random.default_rng(RANK).integers(-15, 16, 1000).astype(np.float32)
    expected = np.empty_like(x)
    WORLD.Allreduce(x, expected)
    assert np.array_equal(compressed_allreduce(x.copy(), comm=comm, compressor=compressor_for(name, x.size)), expected)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("name, unit", [("bf16", 2.0**-8), ("fp16", 2.0**-11), ("int8", None)])
@pytest.mark.parametrize("op", ["sum", "avg"])
def test_the_error_is_within_the_codecs_bound_and_every_rank_gets_the_same_floats(comm, name, unit, op):
    numel = 12 * 256  # whole int8 blocks: the bound below takes them as the chunks' blocks
    everyone = _inputs(numel, 7)
    mine = everyone[RANK].copy()
    out = compressed_allreduce(torch.from_numpy(mine), comm=comm, compressor=compressor_for(name, numel), op=op)
    scale = 1.0 / P if op == "avg" else 1.0
    exact = everyone.astype(np.float64).sum(axis=0) * scale
    magnitude = np.abs(everyone).astype(np.float64).sum(axis=0) * scale
    if unit is not None:
        # Each input rounds once (unit * |x_i|), the float32 sum adds (P - 1) roundings and the
        # reduced value rounds once more (unit * |s|).
        bound = unit * magnitude + (P - 1) * U * magnitude + unit * np.abs(exact) * (1 + 2 * unit)
    else:
        # Each input errs by at most half its block's step (absmax / 254), the reduced chunk by half
        # of its own block's step; float32 arithmetic adds a few ulps of each.
        steps = np.repeat(np.abs(everyone).reshape(P, -1, 256).max(axis=2) / 254, 256, axis=1)
        reduced_step = np.repeat(np.abs(exact).reshape(-1, 256).max(axis=1) / 254, 256)
        bound = steps.sum(axis=0) * scale * (1 + 1e-5) + reduced_step * 1.01 + 8 * P * U * magnitude
    assert np.all(np.abs(out.numpy() - exact) <= bound)
    gathered = WORLD.allgather(out.numpy())
    assert all(np.array_equal(gathered[0], other) for other in gathered[1:])


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("op", ["sum", "avg"])
def test_error_feedback_carries_what_int8_lost_and_never_loses_it(comm, op):
    # Over K calls: sum of results = sum of inputs - (the contribution residuals' sum) - (the owner
    # residuals), all in the op's units; the float32 additions of the bookkeeping are the only slack.
    numel, calls = 1500, 20
    compressor = compressor_for("int8", numel)
    scale = 1.0 / P if op == "avg" else 1.0
    results, inputs, magnitude = np.zeros(numel), np.zeros(numel), np.zeros(numel)
    for k in range(calls):
        everyone = _inputs(numel, 100 + k)
        inputs += everyone.astype(np.float64).sum(axis=0) * scale
        magnitude += np.abs(everyone).astype(np.float64).sum(axis=0) * scale
        results += compressed_allreduce(everyone[RANK].copy(), comm=comm, compressor=compressor, op=op)
    residuals = sum(WORLD.allgather(compressor.residual.astype(np.float64))) * scale
    owners = sum(WORLD.allgather(compressor.owner_residual.astype(np.float64)))
    # Per call and element, the float32 operations (x + e, the P - 1 additions of the sum, the
    # scaling, + e_o, and the residuals' subtractions) each round by at most U of at most twice
    # the magnitudes in play.
    slack = 2 * (P + 4) * U * magnitude
    assert np.all(np.abs(results - (inputs - residuals - owners)) <= slack)
    # Without the residuals the books would not balance: int8 did lose that much.
    assert np.abs(residuals + owners).max() > slack.max()


@pytest.mark.mpi(min_size=2)
def test_the_bytes_sent_are_the_encoded_chunks_each_rank_handed_to_mpi(comm):
    numel = 10_000
    sent = {}
    for name in CODECS:
        compressor = compressor_for(name, numel)
        compressed_allreduce(np.ones(numel, np.float32), comm=comm, compressor=compressor)
        sent[name] = WORLD.allgather(compressor.bytes_sent)
    for name, per_rank in sent.items():
        # Each rank sends the others' chunks of its buffer (the all-to-all) and its reduced chunk
        # to every other rank (the allgather): over the ranks, 2 (P - 1) encoded buffers, what a
        # bandwidth-optimal allreduce of the float32 buffer sends of it.
        assert sum(per_rank) == 2 * (P - 1) * CODECS[name].wire_nbytes(numel), name
    float32 = 2 * (P - 1) * 4 * numel
    assert sum(sent["int8"]) / float32 == pytest.approx(0.254, abs=0.001)  # 1 byte + 4 per 256
    assert sum(sent["bf16"]) / float32 == sum(sent["fp16"]) / float32 == 0.5


@pytest.mark.mpi(min_size=2)
def test_without_error_feedback_nothing_is_carried(comm):
    compressor = Compressor(CODECS["int8"], 600, error_feedback=False)
    first = compressed_allreduce(_inputs(600, 3)[RANK].copy(), comm=comm, compressor=compressor)
    again = compressed_allreduce(_inputs(600, 3)[RANK].copy(), comm=comm, compressor=compressor)
    assert compressor.residual is None and np.array_equal(first, again)


def _block_steps(values, scale=1.0):
    """Half of int8's step, absmax / 254, of each 256-element block of ``values`` (float64), per element."""
    padded = np.zeros(-(-values.size // 256) * 256)
    padded[: values.size] = np.abs(values)
    return np.repeat(padded.reshape(-1, 256).max(axis=1) / 254, 256)[: values.size] * scale


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("straggler", [0, -1])
@pytest.mark.parametrize("op", ["sum", "avg"])
def test_compressed_stragglar_gives_every_rank_the_same_floats_within_int8s_bound(comm, straggler, op):
    from collectives.stragglar.runtime import StragglerAwareAllreduce

    numel = 5000
    everyone = _inputs(numel, 11)
    with StragglerAwareAllreduce(comm, straggler % P, everyone[RANK], op=op) as plan:
        out = plan(everyone[RANK].copy(), compressor=compressor_for("int8", numel))
    scale = 1.0 / P if op == "avg" else 1.0
    exact = everyone.astype(np.float64).sum(axis=0) * scale
    magnitude = np.abs(everyone).astype(np.float64).sum(axis=0)
    # Each contribution is encoded once (the peers' in their ReduceScatter, the straggler's in its
    # round), the peers' partial sum once and the final value once: half a step of each, and of
    # blocks no larger than the sum of the magnitudes.
    bound = (
        sum(_block_steps(row.astype(np.float64)) for row in everyone) * scale + 2 * _block_steps(magnitude, scale)
    ) * (1 + 1e-5) + 8 * P * U * magnitude * scale
    assert np.all(np.abs(out - exact) <= bound)
    gathered = WORLD.allgather(out)
    assert all(np.array_equal(gathered[0], other) for other in gathered[1:])


@pytest.mark.mpi(min_size=3)
def test_compressed_stragglar_is_exact_where_bf16_holds_the_values(comm):
    from collectives.stragglar.runtime import StragglerAwareAllreduce

    x = np.random.default_rng(RANK).integers(-15, 16, 1000).astype(np.float32)
    expected = np.empty_like(x)
    WORLD.Allreduce(x, expected)
    with StragglerAwareAllreduce(comm, P - 1, x) as plan:
        assert np.array_equal(plan(x.copy(), compressor=compressor_for("bf16", x.size)), expected)


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("numel", [1200, 300])  # 300: two int8 blocks, fewer than the chunks from 4 ranks on
def test_compressed_stragglar_loses_nothing_over_calls(comm, numel):
    from collectives.stragglar.runtime import StragglerAwareAllreduce

    calls = 12
    compressor = compressor_for("int8", numel)
    results, inputs, magnitude = np.zeros(numel), np.zeros(numel), np.zeros(numel)
    with StragglerAwareAllreduce(comm, 1, np.zeros(numel, np.float32)) as plan:
        for k in range(calls):
            everyone = _inputs(numel, 300 + k)
            inputs += everyone.astype(np.float64).sum(axis=0)
            magnitude += np.abs(everyone).astype(np.float64).sum(axis=0)
            results += plan(everyone[RANK].copy(), compressor=compressor)
    residuals = sum(WORLD.allgather(compressor.residual.astype(np.float64)))
    owners = sum(WORLD.allgather(compressor.owner_residual.astype(np.float64)))
    assert np.all(np.abs(results - (inputs - residuals - owners)) <= 2 * (P + 4) * U * magnitude)
    assert np.abs(residuals + owners).max() > 100 * (2 * (P + 4) * U * magnitude).max()


@pytest.mark.mpi(min_size=3)
def test_a_predicted_straggler_runs_the_compressed_rounds_and_the_others_the_compressed_allreduce(comm):
    from collectives.stragglar.training_sync import PredictedStragglerSync

    numel = 3000
    compressor = compressor_for("int8", numel)
    with PredictedStragglerSync(comm, [np.zeros(numel, np.float32)], op="avg") as sync:
        for k in range(8):
            everyone = _inputs(numel, 500 + k)
            late = 0.5 if RANK == P - 1 else 0.0  # rank P - 1 arrives half a second after the others
            out = sync([everyone[RANK].copy()], arrival_s=late, compressors=[compressor])[0]
            gathered = WORLD.allgather(out)
            assert all(np.array_equal(gathered[0], other) for other in gathered[1:])
        ran = [int(row[1]) for row in sync.log]  # the rank StragglAR ran for, -1 for the allreduce
    # The compressed allreduce first, then StragglAR's compressed rounds once rank P - 1 is
    # predicted (until its measured rounds show the library faster for so small a buffer).
    assert ran[0] == -1 and P - 1 in ran
