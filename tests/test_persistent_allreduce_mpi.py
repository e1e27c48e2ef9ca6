"""The persistent allreduce (allreduce_init): checked once, then only the reduction.

Its calls must give what ``allreduce`` gives, and ``auto`` must resolve to
the library where no tuning table applies.  That its construction refuses
what ``allreduce`` refuses is in test_bad_input_mpi.py.
"""

import os

import numpy as np
import pytest
import torch
from mpi4py import MPI

from collectives import Communicator, allreduce, allreduce_init
from collectives.schedules.blocking import ALLREDUCE_CHOICES, LIBRARY_MARGIN, choose_allreduce
from collectives.schedules.tuning import TUNING_ENV

pytestmark = pytest.mark.mpi

WORLD = MPI.COMM_WORLD


@pytest.fixture
def comm():
    with Communicator(WORLD) as comm:
        yield comm


@pytest.mark.parametrize("algorithm", [*ALLREDUCE_CHOICES, "auto"])
@pytest.mark.parametrize("op", ["sum", "avg"])
@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_each_call_reduces_what_is_in_the_bound_buffer_now(comm, algorithm, op, kind):
    numel = 1000
    data = np.zeros(numel, np.float32) if kind == "numpy" else torch.zeros(numel)
    reduce = allreduce_init(data, comm=comm, algorithm=algorithm, op=op)
    assert reduce.algorithm in ALLREDUCE_CHOICES
    for call in range(3):
        # Small integers: every schedule's sum is exact, whatever its order.
        inputs = np.arange(numel, dtype=np.float32) % 7 + comm.rank + call
        data[:] = inputs if kind == "numpy" else torch.from_numpy(inputs)
        expected = inputs.copy()
        allreduce(expected, comm=comm, algorithm=reduce.algorithm, op=op)
        assert reduce() is None and reduce.data is data
        np.testing.assert_array_equal(np.asarray(data), expected)
        total = sum((np.arange(numel) % 7 + r + call) for r in range(comm.size))
        np.testing.assert_allclose(np.asarray(data), total / comm.size if op == "avg" else total, rtol=1e-6)


@pytest.fixture
def untuned(monkeypatch):
    """A communicator that finds no tuning table (a setting nobody measured)."""
    monkeypatch.setitem(os.environ, TUNING_ENV, "off")
    with Communicator(WORLD) as comm:
        yield comm


@pytest.mark.parametrize("nbytes", [4096, 1 << 20, 16 << 20])
def test_without_a_table_auto_is_the_library_where_it_may_run(untuned, nbytes):
    assert untuned.tuning is None
    assert allreduce_init(np.zeros(nbytes // 4, np.float32), comm=untuned).algorithm == "mpi"
    # float16: no MPI sum, so ours by the thresholds.
    half = allreduce_init(torch.zeros(nbytes // 2, dtype=torch.float16), comm=untuned)
    assert half.algorithm == choose_allreduce(nbytes, untuned.size, None, "float16") != "mpi"


def test_with_the_repositorys_table_auto_takes_its_fastest_ties_to_the_library(comm):
    # 2, 4 and 8 ranks on one node have a committed table for both libraries.
    if comm.tuning is None:
        pytest.skip(f"no committed table for {comm.size} ranks of this library and node")
    for nbytes in (4096, 1 << 20, 64 << 20):
        chosen = allreduce_init(np.zeros(nbytes // 4, np.float32), comm=comm).algorithm
        assert chosen == choose_allreduce(nbytes, comm.size, comm.tuning, "float32")
        assert chosen == comm.tuning.fastest(nbytes, tuple(ALLREDUCE_CHOICES), "mpi", LIBRARY_MARGIN)
