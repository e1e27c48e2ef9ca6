"""Our Allreduce, ReduceScatter, Allgather and group allreduce against MPI's own.

Run under ``mpiexec -n N python -m mpi4py -m pytest --with-mpi``.  Each test
runs on sub-communicators of the first k world ranks, for each k in ``SIZES``
(the sizes this world size adds, see :func:`sub`); ranks outside one skip.
"""

import hashlib
import os

import numpy as np
import pytest
import torch
from mpi4py import MPI
from subcomms import first_ranks, member

from collectives import (
    Communicator,
    allgather,
    allreduce,
    block_offsets,
    butterfly_groups,
    group_allreduce,
    group_allreduce_init,
    reduce_scatter,
)
from collectives.schedules.blocking import (
    ALLGATHER_ALGORITHMS,
    ALLREDUCE_ALGORITHMS,
    ALLREDUCE_CHOICES,
    REDUCE_SCATTER_ALGORITHMS,
)
from collectives.wait_avoiding.group_allreduce import GROUP_ALLREDUCE_CHOICES, choose_group_allreduce, group_schedule
from collectives.wait_avoiding.groups import ButterflyGrouping

pytestmark = pytest.mark.mpi

WORLD = MPI.COMM_WORLD
ALL_SIZES = (1, 2, 3, 4, 5, 8)


def _sizes(world, stages):
    """The sizes of ALL_SIZES a world of ``world`` ranks tests when the MPI
    stages run ``stages`` ranks: those no smaller stage could (all up to
    ``world`` for a world that is not a stage)."""
    below = max((s for s in stages if s < world), default=0) if world in stages else 0
    return [k for k in ALL_SIZES if below < k <= world]


# The MPI stages: the Makefile's MPI_SIZES, which make passes on to the tests
# when it is given (make test MPI_SIZES=4), else its default, 2 4 8.  Rank
# 0's: every rank must collect the same tests, and a launcher may not pass
# the environment on to other nodes.
STAGES = [
    int(n) for n in WORLD.bcast(os.environ.get("MPI_SIZES", "2 4 8") if WORLD.rank == 0 else None, root=0).split()
]
SIZES = _sizes(WORLD.size, STAGES)
DTYPES = [np.float32, np.float64, np.int32, np.int64]


def _counts(k):
    """Element counts: empty, one, around the rank count, odd, and ~3 MiB."""
    return sorted({0, 1, max(k - 1, 0), k + 1, 7, 1001, 786_433})


@pytest.fixture(scope="module", params=SIZES, ids=lambda k: f"ranks{k}")
def sub(request):
    """A Communicator over the first k world ranks, for every k in SIZES.

    The sizes are 1, 2, 3, 4, 5 and 8, each tested once over the MPI stages
    of 2, 4 and 8 ranks (the Makefile's MPI_SIZES): a stage tests only the
    sizes the smaller stage could not, 1 and 2 on a world of 2, 3 and 4 on 4,
    5 and 8 on 8 (a size k behaves the same whatever world it is cut from:
    its ranks are the first k, the others skip).  Every stage but the first
    still runs a sub-communicator smaller than its world (3 of 4, 5 of 8),
    and its whole world.  ``make test MPI_SIZES=4`` (a site's MPI checked on
    4 ranks alone) tests every size up to 4, as does a world size that is not
    a stage; by hand, ``MPI_SIZES=N scripts/mpi-pytest N ...`` tests every
    size up to N.
    """
    yield from first_ranks(request.param)


def _random(n, dtype, seed):
    rng = np.random.default_rng(seed)
    if np.issubdtype(dtype, np.integer):
        return rng.integers(-1000, 1000, n).astype(dtype)
    return rng.standard_normal(n).astype(dtype)


def _reference(x, comm):
    ref = np.empty_like(x)
    comm.data.Allreduce(x, ref, op=MPI.SUM)
    return ref


def _assert_close(got, ref):
    if np.issubdtype(got.dtype, np.integer):
        np.testing.assert_array_equal(got, ref)
    else:
        tol = 1e-5 if got.dtype == np.float32 else 1e-12
        np.testing.assert_allclose(got, ref, rtol=tol, atol=tol)


def _assert_same_everywhere(data, comm):
    digest = hashlib.sha256(np.ascontiguousarray(data).tobytes()).hexdigest()
    digests = comm.control.allgather(digest)
    assert digests == [digests[0]] * comm.size, "ranks disagree bitwise"


@pytest.mark.parametrize("algorithm", [*ALLREDUCE_CHOICES, "auto"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_allreduce_equals_mpi_allreduce(sub, algorithm, dtype):
    comm = member(sub)
    for n in _counts(comm.size):
        x = _random(n, dtype, seed=(comm.rank, n))
        ref = _reference(x, comm)
        assert allreduce(x, comm=comm, algorithm=algorithm) is x
        _assert_close(x, ref)
        _assert_same_everywhere(x, comm)


@pytest.mark.parametrize("algorithm", ALLREDUCE_CHOICES)
def test_allreduce_average(sub, algorithm):
    comm = member(sub)
    x = _random(1001, np.float64, seed=comm.rank)
    ref = _reference(x, comm) / comm.size
    allreduce(x, comm=comm, algorithm=algorithm, op="avg")
    _assert_close(x, ref)
    _assert_same_everywhere(x, comm)


@pytest.mark.parametrize("algorithm", ALLREDUCE_ALGORITHMS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
def test_allreduce_half_precision_tensors(sub, algorithm, dtype):
    # Small integers: every partial sum is exact in 8 significand bits, so the
    # result must equal MPI's float32 Allreduce exactly whatever the order.
    comm = member(sub)
    values = _random(1001, np.int32, seed=comm.rank) % 9 - 4
    x = torch.tensor(values, dtype=dtype)
    ref = _reference(values.astype(np.float32), comm)
    allreduce(x, comm=comm, algorithm=algorithm)
    np.testing.assert_array_equal(x.float().numpy(), ref)


def test_the_library_allreduce_refuses_half_precision_on_every_rank_before_moving_data(sub):
    # MPI 3.1 has no float16 datatype to sum: the error names the accepted dtypes.
    comm = member(sub)
    x = torch.ones(17, dtype=torch.float16)
    with pytest.raises((TypeError, ValueError), match="algorithm 'mpi'.*float32, float64, int32, int64; got float16"):
        allreduce(x, comm=comm, algorithm="mpi")
    assert torch.equal(x, torch.ones(17, dtype=torch.float16))
    assert not comm.data.iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)


@pytest.mark.parametrize("algorithm", ALLREDUCE_CHOICES)
def test_tensor_and_array_give_bitwise_equal_results(sub, algorithm):
    comm = member(sub)
    x = _random(4099, np.float32, seed=comm.rank)
    t = torch.from_numpy(x.copy())
    allreduce(x, comm=comm, algorithm=algorithm)
    allreduce(t, comm=comm, algorithm=algorithm)
    assert t.numpy().tobytes() == x.tobytes()


@pytest.mark.parametrize("algorithm", REDUCE_SCATTER_ALGORITHMS)
@pytest.mark.parametrize("op", ["sum", "avg"])
def test_reduce_scatter_equals_mpi_allreduce_block(sub, algorithm, op):
    comm = member(sub)
    for n in _counts(comm.size):
        x = _random(n, np.float64, seed=(comm.rank, n))
        ref = _reference(x, comm) / (comm.size if op == "avg" else 1)
        lo, hi = reduce_scatter(x, comm=comm, algorithm=algorithm, op=op)
        off = block_offsets(n, comm.size)
        assert (lo, hi) == (off[comm.rank], off[comm.rank + 1])
        _assert_close(x[lo:hi], ref[lo:hi])


@pytest.mark.parametrize("algorithm", ALLGATHER_ALGORITHMS)
def test_allgather_collects_every_block(sub, algorithm):
    comm = member(sub)
    for n in _counts(comm.size):
        off = block_offsets(n, comm.size)
        x = np.full(n, -1, dtype=np.int64)
        x[off[comm.rank] : off[comm.rank + 1]] = 10 * comm.rank + 1
        allgather(x, comm=comm, algorithm=algorithm)
        expected = np.repeat(10 * np.arange(comm.size) + 1, np.diff(off))
        np.testing.assert_array_equal(x, expected)


def _group_sizes(P):
    """The group sizes S tested on P ranks: the powers of two up to P, 3 and P
    (groups that fold the ranks above the largest power of two)."""
    return sorted({1 << k for k in range(P.bit_length())} | {min(3, P), P})


@pytest.mark.parametrize("algorithm", [*GROUP_ALLREDUCE_CHOICES, "auto"])
def test_group_allreduce_equals_mpi_allreduce_within_group(sub, algorithm):
    comm = member(sub)
    for group_size in _group_sizes(comm.size):
        # Every grouping of a period (at most 3 iterations on 8 ranks or fewer) and a large t.
        for t in (0, 1, 2, 2**40 + 3):
            groups = butterfly_groups(comm.size, group_size, t)
            color = next(i for i, g in enumerate(groups) if comm.rank in g)
            group_comm = comm.data.Split(color, comm.rank)
            # 300_001 elements (2.4 MB) where "auto" picks halving-doubling: the
            # schedules named alone run the same code on 1001 as on it.
            for n in (0, 1, 7, 1001, *([300_001] if algorithm == "auto" else [])):
                x = _random(n, np.float64, seed=(comm.rank, t, n))
                ref = np.empty_like(x)
                group_comm.Allreduce(x, ref)
                group_allreduce(x, comm=comm, group_size=group_size, t=t, algorithm=algorithm)
                _assert_close(x, ref)
                digests = group_comm.allgather(hashlib.sha256(x.tobytes()).digest())
                assert len(set(digests)) == 1, "group members disagree bitwise"
            group_comm.Free()


@pytest.mark.parametrize("algorithm", [*GROUP_ALLREDUCE_CHOICES, "auto"])
@pytest.mark.parametrize("library", ["numpy", "torch"])
def test_group_schedules_out_of_place_equal_in_place(sub, algorithm, library):
    """With ``src`` (how the wait-avoiding collective runs them) the
    schedules write the in-place result bitwise into ``buf``, whatever it
    held, and leave ``src`` as it was; folded ranks and their hosts too."""
    comm = member(sub)
    for group_size in sorted({1, min(2, comm.size), comm.size}):
        grouping = ButterflyGrouping(comm.size, group_size)
        plan = grouping.plan(5, comm.rank)
        for n in (0, 1, 7, 1001, 300_001):
            schedule = group_schedule(algorithm, comm, grouping, 4 * n)
            x = _random(n, np.float32, seed=(comm.rank, group_size, n))
            source, in_place = x.copy(), x.copy()
            out = np.full(n, np.nan, dtype=np.float32)
            if library == "torch":
                source, in_place, out = map(torch.from_numpy, (source, in_place, out))
            with comm.open_buffer(in_place) as buf:
                schedule(buf, comm, plan, 1.0 / plan.size)
            with comm.open_buffer(out) as buf, comm.open_buffer(source) as src:
                schedule(buf, comm, plan, 1.0 / plan.size, src=src)
            assert np.asarray(out).tobytes() == np.asarray(in_place).tobytes()
            assert np.asarray(source).tobytes() == x.tobytes(), "src was written"


@pytest.mark.parametrize("algorithm", [*GROUP_ALLREDUCE_CHOICES, "auto"])
def test_group_allreduce_with_fixed_groups_averages_in_iteration_0s_groups(sub, algorithm):
    """``dynamic_groups=False`` (WAGMA's ablation 2): at every t the mean over
    iteration 0's group (for powers of two blocks of S consecutive ranks);
    exact, the data being small integers."""
    comm = member(sub)
    n = 1001

    def data(rank, t):
        return (rank * 1000 + t % 97 + np.arange(n) % 13).astype(np.float64)

    for group_size in _group_sizes(comm.size):
        group = ButterflyGrouping(comm.size, group_size).group_of(0, comm.rank)
        if group_size & (group_size - 1) == 0 and comm.size & (comm.size - 1) == 0:
            first = comm.rank // group_size * group_size
            assert group == list(range(first, first + group_size))
        for t in (0, 1, 2, 5, 2**40 + 3):
            x = data(comm.rank, t)
            group_allreduce(
                x, comm=comm, group_size=group_size, t=t, op="avg", algorithm=algorithm, dynamic_groups=False
            )
            # The schedules scale by the reciprocal of the group's size, exactly as here.
            expected = sum(data(q, t) for q in group) * (1.0 / len(group))
            np.testing.assert_array_equal(x, expected, err_msg=f"S={group_size}, t={t}")


@pytest.mark.parametrize("algorithm", [*GROUP_ALLREDUCE_CHOICES, "auto"])
@pytest.mark.parametrize("library", ["numpy", "torch"])
def test_a_persistent_group_allreduce_is_group_allreduce_bit_for_bit(sub, algorithm, library):
    """Bound once, called with any t (the iterations of several periods and
    a large one), sum and average, dynamic and fixed groups: the bytes of
    group_allreduce with the same arguments."""
    comm = member(sub)
    for group_size in _group_sizes(comm.size):
        for op, dynamic in (("sum", True), ("avg", True), ("avg", False)):
            bound_data = np.zeros(1001, dtype=np.float32)
            if library == "torch":
                bound_data = torch.from_numpy(bound_data)
            average = group_allreduce_init(
                bound_data, comm=comm, group_size=group_size, op=op, algorithm=algorithm, dynamic_groups=dynamic
            )
            assert average.algorithm == (choose_group_allreduce(4 * 1001) if algorithm == "auto" else algorithm)
            for t in (0, 1, 2, 3, 4, 5, 2**40 + 3):
                x = _random(1001, np.float32, seed=(comm.rank, group_size, t))
                expected = x.copy()
                group_allreduce(
                    expected, comm=comm, group_size=group_size, t=t, op=op, algorithm=algorithm, dynamic_groups=dynamic
                )
                bound_data[:] = torch.from_numpy(x) if library == "torch" else x
                assert average(t) is None
                got = bound_data.numpy() if library == "torch" else bound_data
                assert got.tobytes() == expected.tobytes(), f"S={group_size}, {op}, dynamic={dynamic}, t={t}"
    with pytest.raises(ValueError, match="group_allreduce_init: t must be >= 0, got -1"):
        average(-1)


def test_group_allreduce_refuses_a_dynamic_groups_that_is_not_a_bool(sub):
    comm = member(sub)
    with pytest.raises(TypeError, match="dynamic_groups must be True or False, got 'no'"):
        group_allreduce(np.zeros(3), comm=comm, group_size=1, t=0, dynamic_groups="no")


def test_group_allreduce_average(sub):
    comm = member(sub)
    group_size = comm.size
    x = _random(513, np.float64, seed=comm.rank)
    ref = _reference(x, comm) / group_size
    group_allreduce(x, comm=comm, group_size=group_size, t=3, op="avg")
    _assert_close(x, ref)


def test_communicator_channels_are_private():
    # A message on the original communicator is invisible on both duplicates,
    # and one on the data channel is invisible on the control channel.
    with Communicator(WORLD) as comm:
        assert MPI.Comm.Compare(comm.data, WORLD) == MPI.CONGRUENT
        me, tag = WORLD.rank, 77
        request = WORLD.Isend(np.ones(1), me, tag)
        assert WORLD.probe(me, tag)
        assert not comm.data.iprobe(me, tag)
        assert not comm.control.iprobe(me, tag)
        WORLD.Recv(np.empty(1), me, tag)
        request.Wait()
        request = comm.data.Isend(np.ones(1), me, tag)
        assert comm.data.probe(me, tag)
        assert not comm.control.iprobe(me, tag)
        comm.data.Recv(np.empty(1), me, tag)
        request.Wait()
    assert comm.closed


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("algorithm", ALLREDUCE_ALGORITHMS)
def test_cuda_tensors_give_the_host_result(sub, algorithm):
    # Staged through pinned host memory, or handed to a CUDA-aware MPI.
    comm = member(sub)
    host = _random(100_003, np.float32, seed=comm.rank)
    device = torch.from_numpy(host.copy()).cuda()
    allreduce(host, comm=comm, algorithm=algorithm)
    allreduce(device, comm=comm, algorithm=algorithm)
    assert device.is_cuda and device.cpu().numpy().tobytes() == host.tobytes()


@pytest.mark.parametrize("offsets", [(-1, 1), (1,), (2, -3, 0)])
def test_neighbor_sum_equals_the_gathered_sum(sub, offsets):
    from collectives.neighbors import neighbor_sum

    comm = member(sub)
    x = _random(1001, np.float64, seed=comm.rank)
    everyone = comm.control.allgather(x.copy())
    expected = x + sum(everyone[(comm.rank + o) % comm.size] for o in offsets)
    neighbor_sum(x, comm=comm, offsets=offsets)
    _assert_close(x, expected)
