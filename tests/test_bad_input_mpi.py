"""A mistake on one rank raises the same error on every rank, and nothing hangs.

Each test makes one rank (the last) pass a bad argument, expects the error on
every rank, and then runs a correct allreduce on the same communicator: had
any data moved before the error, that allreduce would receive stale messages
or hang.
"""

import numpy as np
import pytest
import torch
from mpi4py import MPI

from collectives import (
    Communicator,
    allgather,
    allreduce,
    allreduce_init,
    group_allreduce,
    group_allreduce_init,
    reduce_scatter,
)

pytestmark = pytest.mark.mpi

WORLD = MPI.COMM_WORLD
LAST = WORLD.size - 1


@pytest.fixture
def comm():
    with Communicator(WORLD) as comm:
        yield comm
        # The communicator is intact: a correct collective still works.
        x = np.full(5, float(comm.rank))
        allreduce(x, comm=comm)
        np.testing.assert_array_equal(x, sum(range(comm.size)))


def _on_last(bad, good):
    return bad if WORLD.rank == LAST else good


@pytest.mark.skipif(WORLD.size < 2, reason="needs two ranks to disagree")
def test_different_sizes(comm):
    x = np.zeros(_on_last(11, 10))
    with pytest.raises(
        ValueError,
        match=rf"numel must be the same on every "
        rf"rank, got rank 0: 10, .*rank {LAST}: 11",
    ):
        allreduce(x, comm=comm)


@pytest.mark.skipif(WORLD.size < 2, reason="needs two ranks to disagree")
def test_different_dtypes(comm):
    x = np.zeros(10, dtype=_on_last(np.float32, np.float64))
    with pytest.raises(ValueError, match=rf"dtype must be the same.*rank {LAST}: float32"):
        reduce_scatter(x, comm=comm)


def test_non_contiguous_buffer(comm):
    x = np.zeros((10, 2))
    with pytest.raises(ValueError, match=rf"rank {LAST}: buffer must be contiguous"):
        allgather(_on_last(x[:, 0], x[:, 0].copy()), comm=comm)


def test_unsupported_type(comm):
    with pytest.raises(
        TypeError,
        match=rf"rank {LAST}: buffer must be a numpy.ndarray "
        rf"or torch.Tensor, got list",
    ):
        allreduce(_on_last([0.0] * 4, np.zeros(4)), comm=comm)


def test_unsupported_dtype(comm):
    with pytest.raises(TypeError, match=r"buffer dtype must be one of .*got complex128"):
        allreduce(np.zeros(4, dtype=complex), comm=comm)


def test_unknown_algorithm(comm):
    with pytest.raises(
        ValueError,
        match=rf"rank {LAST}: algorithm must be one of "
        rf"'ring', 'rhd', 'recursive_doubling', 'mpi', got 'tree'",
    ):
        allreduce(np.zeros(4), comm=comm, algorithm=_on_last("tree", "ring"))


@pytest.mark.skipif(WORLD.size < 2, reason="needs two ranks to disagree")
def test_different_algorithms(comm):
    with pytest.raises(ValueError, match=r"algorithm must be the same on every rank"):
        allreduce(np.zeros(4), comm=comm, algorithm=_on_last("ring", "rhd"))


def test_average_of_integers(comm):
    with pytest.raises(ValueError, match=r"op 'avg' needs a floating-point buffer, got int64"):
        allreduce(np.zeros(4, dtype=np.int64), comm=comm, op="avg")


def test_unknown_op(comm):
    with pytest.raises(ValueError, match=r"op must be one of 'sum', 'avg', got 'max'"):
        allreduce(np.zeros(4), comm=comm, op="max")


def test_group_size_of_zero(comm):
    with pytest.raises(ValueError, match=rf"rank {LAST}: group_size must be an int from 1 to the world size"):
        group_allreduce(np.zeros(4), comm=comm, group_size=_on_last(0, 1), t=0)


def test_group_size_larger_than_world(comm):
    with pytest.raises(
        ValueError,
        match=rf"group_size must be an int from 1 to the world size {WORLD.size}, got {2 * WORLD.size}",
    ):
        group_allreduce(np.zeros(4), comm=comm, group_size=2 * WORLD.size, t=0)


@pytest.mark.skipif(WORLD.size < 2, reason="needs two ranks to disagree")
def test_different_iterations(comm):
    with pytest.raises(ValueError, match=r"t must be the same on every rank"):
        group_allreduce(np.zeros(4), comm=comm, group_size=1, t=_on_last(1, 0))


@pytest.mark.skipif(WORLD.size < 3, reason="needs a world of three ranks or more")
def test_a_group_larger_than_three_ranks():
    raw = WORLD.Split(0 if WORLD.rank < 3 else MPI.UNDEFINED, WORLD.rank)
    if raw == MPI.COMM_NULL:
        pytest.skip("outside the three-rank communicator")
    with Communicator(raw) as comm:
        with pytest.raises(ValueError, match=r"ranks 0-2: group_size must be an int from 1 to the world size 3"):
            group_allreduce(np.zeros(4), comm=comm, group_size=4, t=0)
        x = np.ones(3)
        allreduce(x, comm=comm)
        np.testing.assert_array_equal(x, 3.0)
    raw.Free()


@pytest.mark.skipif(WORLD.size < 2, reason="needs two ranks to disagree")
def test_neighbor_offsets_differ(comm):
    from collectives.neighbors import neighbor_sum

    with pytest.raises(ValueError, match="offsets must be the same on every rank"):
        neighbor_sum(np.zeros(4), comm=comm, offsets=_on_last((1,), (-1,)))


# Each case: the buffer and keyword arguments this rank passes (the last rank
# alone passes the bad ones, or every rank where the problem is everyone's).
BAD = {
    "a different size": lambda: (np.zeros(_on_last(11, 10), np.float32), {}),
    "a different dtype": lambda: (np.zeros(10, _on_last(np.float64, np.float32)), {}),
    "a non-contiguous buffer": lambda: (_on_last(np.zeros((10, 2))[:, 0], np.zeros(10)), {}),
    "not a buffer": lambda: (_on_last([0.0] * 4, np.zeros(4)), {}),
    "a dtype no schedule sums": lambda: (np.zeros(4, complex), {}),
    "an unknown algorithm": lambda: (np.zeros(4), {"algorithm": _on_last("tree", "ring")}),
    "a dtype the library cannot sum": lambda: (
        torch.zeros(4, dtype=_on_last(torch.float16, torch.float32)),
        {"algorithm": "mpi"},
    ),
    "avg of integers": lambda: (np.zeros(4, np.int64), {"op": "avg"}),
    "a different op": lambda: (np.zeros(4), {"op": _on_last("avg", "sum")}),
    "a different algorithm": lambda: (np.zeros(4), {"algorithm": _on_last("ring", "rhd")}),
}


def _raised(call):
    try:
        call()
    except (ValueError, TypeError) as exc:
        return exc
    return None


@pytest.mark.parametrize("case", BAD)
def test_a_persistent_allreduce_refuses_what_allreduce_refuses(comm, case):
    data, kwargs = BAD[case]()
    if WORLD.size < 2 and case.startswith("a different"):
        pytest.skip("needs two ranks to disagree")
    full = _raised(lambda: allreduce(data, comm=comm, **kwargs))
    fast = _raised(lambda: allreduce_init(data, comm=comm, **kwargs))
    assert full is not None, f"allreduce accepted {case}"
    assert type(fast) is type(full) and str(fast) == str(full)
    # Every rank raised, before any data moved: the fixture's allreduce still works.


# The group allreduce's cases: the buffer and keyword arguments this rank passes.
BAD_GROUP = {
    "a different size": lambda: (np.zeros(_on_last(11, 10), np.float32), {"group_size": 1}),
    "a group size of zero": lambda: (np.zeros(4), {"group_size": _on_last(0, 1)}),
    "a group larger than the world": lambda: (np.zeros(4), {"group_size": 2 * WORLD.size}),
    "a dynamic_groups that is not a bool": lambda: (np.zeros(4), {"group_size": 1, "dynamic_groups": "no"}),
    "an unknown algorithm": lambda: (np.zeros(4), {"group_size": 1, "algorithm": _on_last("ring", "mpi")}),
    "a dtype the library cannot sum": lambda: (
        torch.zeros(4, dtype=_on_last(torch.float16, torch.float32)),
        {"group_size": 1, "algorithm": "mpi"},
    ),
    "avg of integers": lambda: (np.zeros(4, np.int64), {"group_size": 1, "op": "avg"}),
    "a different algorithm": lambda: (
        np.zeros(4),
        {"group_size": 1, "algorithm": _on_last("recursive_doubling", "halving_doubling")},
    ),
}


@pytest.mark.parametrize("case", BAD_GROUP)
def test_a_persistent_group_allreduce_refuses_what_group_allreduce_refuses(comm, case):
    data, kwargs = BAD_GROUP[case]()
    if WORLD.size < 2 and case.startswith(("a different", "a group size of zero")):
        pytest.skip("needs two ranks to disagree")
    full = _raised(lambda: group_allreduce(data, comm=comm, t=0, **kwargs))
    bound = _raised(lambda: group_allreduce_init(data, comm=comm, **kwargs))
    assert full is not None, f"group_allreduce accepted {case}"
    assert type(bound) is type(full)
    assert str(bound) == str(full).replace("group_allreduce:", "group_allreduce_init:", 1)
    # Every rank raised, before any data moved: the fixture's allreduce still works.
