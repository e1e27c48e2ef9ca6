"""StragglAR's runtime and the Broadcast baseline against MPI's Allreduce.

Run under ``mpiexec -n N python -m mpi4py -m pytest --with-mpi``.  Each test
runs on sub-communicators of the sizes in ``SIZES`` that fit in the world
(2, 4, 6 and 8 ranks from an 8-rank launch); ranks outside one skip.
"""

import time

import numpy as np
import pytest
import torch
from mpi4py import MPI
from subcomms import first_ranks, member

from collectives import StragglerAwareAllreduce, stragglar_allreduce
from collectives.stragglar import Schedule, generate, plans
from collectives.stragglar.runtime import STRAGGLER_AWARE_ALGORITHMS

pytestmark = pytest.mark.mpi

WORLD = MPI.COMM_WORLD
SIZES = [k for k in (2, 4, 6, 8) if k <= WORLD.size]


@pytest.fixture(scope="module", params=SIZES, ids=lambda k: f"ranks{k}")
def sub(request):
    """A Communicator over the first k world ranks (None on the others)."""
    yield from first_ranks(request.param)


def _stragglers(n):
    return sorted({n - 1, 0, n // 2})


def _counts(n):
    """Empty, fewer elements than chunks, around n - 1, odd, and ~1 MiB."""
    return sorted({0, 1, n - 2, n - 1, n, 1001, 262_147})


def _integers(numel, dtype, seed):
    """Integer-valued data, so that every summation order gives the same bits."""
    return np.random.default_rng(seed).integers(-1000, 1000, numel).astype(dtype)


def _reference(x, comm):
    ref = np.empty_like(x)
    comm.data.Allreduce(x, ref, op=MPI.SUM)
    return ref


@pytest.mark.parametrize("algorithm", STRAGGLER_AWARE_ALGORITHMS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_equals_mpi_allreduce(sub, algorithm, dtype):
    comm = member(sub)
    for straggler in _stragglers(comm.size):
        for numel in _counts(comm.size):
            x = _integers(numel, dtype, seed=comm.rank * 1000 + numel + straggler)
            expected = _reference(x, comm)
            with StragglerAwareAllreduce(comm, straggler, x, algorithm=algorithm) as ar:
                assert ar(x) is x
            np.testing.assert_array_equal(x, expected, err_msg=f"{algorithm}, straggler {straggler}, {numel} elements")


@pytest.mark.timing
@pytest.mark.parametrize("algorithm", STRAGGLER_AWARE_ALGORITHMS)
def test_late_straggler_random_floats_bitwise_equal_on_all_ranks(sub, algorithm):
    """The straggler enters 30 ms late; random floats (rounding depends on
    the order of additions) must still come out bitwise equal everywhere."""
    comm = member(sub)
    straggler = comm.size - 1
    x = np.random.default_rng(comm.rank).standard_normal(100_003)
    expected = _reference(x, comm)
    with StragglerAwareAllreduce(comm, straggler, x, algorithm=algorithm, op="avg") as ar:
        for _ in range(3):
            y = x.copy()
            if comm.rank == straggler:
                time.sleep(0.03)
            ar(y)
            np.testing.assert_allclose(y, expected / comm.size, rtol=1e-12, atol=1e-12)
            everyone = comm.data.allgather(y.tobytes())
            assert all(b == everyone[0] for b in everyone), "ranks disagree bitwise"
            # The non-stragglers time their ReduceScatter (it prices StragglAR's rounds); the
            # straggler runs none. The Broadcast baseline's pre-phase is an allreduce: not timed.
            timed = algorithm == "stragglar" and comm.rank != straggler
            assert np.isfinite(ar.reduce_scatter_s) == timed and not ar.reduce_scatter_s <= 0


def test_torch_tensors_and_one_shot_function(sub):
    comm = member(sub)
    x = torch.arange(5 * comm.size + 3, dtype=torch.float32) + comm.rank
    expected = torch.from_numpy(_reference(x.numpy(), comm))
    assert stragglar_allreduce(x, comm=comm, straggler=comm.size // 2) is x
    assert torch.equal(x, expected)
    half = torch.arange(33, dtype=torch.bfloat16) + comm.rank
    with StragglerAwareAllreduce(comm, 0, half, op="avg") as ar:
        ar(half)
    want = torch.arange(33, dtype=torch.float32) + (comm.size - 1) / 2
    assert torch.allclose(half.float(), want, rtol=1e-2)


def test_explicit_schedule_and_bad_arguments(sub):
    comm = member(sub)
    n = comm.size
    x = _integers(64, np.float64, comm.rank)
    expected = _reference(x, comm)
    own = Schedule.from_json(generate(n, 0).to_json())
    with StragglerAwareAllreduce(comm, 0, x, schedule=own) as ar:
        ar(x)
    np.testing.assert_array_equal(x, expected)
    cases = [
        (dict(straggler=n), f"straggler must be a rank in range\\({n}\\)"),
        (dict(straggler=0, algorithm="pipelined"), "algorithm must be one of 'stragglar'"),
        (dict(straggler=0, op="max"), "op must be one of 'sum', 'avg'"),
        (dict(straggler=1, schedule=own), "schedule is for n="),
        (dict(straggler=comm.rank % 2), "straggler must be the same on every rank"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            StragglerAwareAllreduce(comm, template=x, **kwargs)
    with StragglerAwareAllreduce(comm, 0, x) as ar:
        with pytest.raises(ValueError, match="data must have 64 elements of float64"):
            ar(np.zeros(63))


def test_a_damaged_cached_plan_is_rebuilt_and_every_rank_gets_the_verified_one(sub, tmp_path, monkeypatch):
    """Rank 0 finds the plan of n altered in the cache (its old digest kept):
    it generates and verifies the plan again, stores it, and every rank
    reduces exactly with it."""
    comm = member(sub)
    n = comm.size
    folder = comm.control.bcast(str(tmp_path))  # rank 0's: the only one that reads the cache
    monkeypatch.setenv(plans.PLAN_CACHE_ENV, folder)
    good = plans.build_plan(n)
    if comm.rank == 0:
        transfers = good.transfers.copy()
        transfers[len(transfers) // 2, 2] ^= 1  # a chunk changed: run, it would mix up the sums
        plans.store_plan(folder, plans.CanonicalPlan(n, transfers, good.round_starts, good.digest))
    plans._plans.pop(n, None)  # on every rank: the plan is shared again, not held
    x = _integers(1001, np.float64, comm.rank)
    expected = _reference(x, comm)
    with StragglerAwareAllreduce(comm, n // 2, x) as ar:
        ar(x)
    np.testing.assert_array_equal(x, expected)
    assert plans._plans[n].digest == good.digest
    if comm.rank == 0:
        cached = plans.load_plan(folder, n)
        assert cached is not None and cached.digest == good.digest
