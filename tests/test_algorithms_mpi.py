"""Training algorithms under mpiexec, against PyTorch's own implementations.

``torch.distributed`` (gloo, on the loopback interface, its port chosen by
rank 0 and shared over MPI) runs the references in the same processes.
Every algorithm runs on any number of ranks; the tests marked ``ON_ODD``
also run, at the stages of 4 and 8 ranks, on blocks of 3 and of 5 and 3
ranks side by side (:data:`subcomms.ODD_BLOCKS`).
"""

import copy
import re
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist
from mpi4py import MPI
from subcomms import ODD_BLOCKS, block_of
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
from torch.distributed.algorithms.model_averaging.hierarchical_model_averager import (
    HierarchicalModelAverager,
)
from torch.nn.parallel import DistributedDataParallel

from collectives import ButterflyGrouping, Communicator
from wagma.algorithms import ALGORITHMS, create
from wagma.emulate.emulator import _butterfly_mean, _folds
from wagma.torch_distributed import init_gloo

pytestmark = pytest.mark.mpi

WORLD = MPI.COMM_WORLD


@pytest.fixture(scope="module")
def torch_distributed():
    init_gloo(WORLD)
    yield
    dist.destroy_process_group()


@pytest.fixture
def comm(request):
    """A Communicator over COMM_WORLD, or with ``"odd"`` over this rank's
    block of :data:`subcomms.ODD_BLOCKS` (a rank in a block of one skips)."""
    if getattr(request, "param", "world") == "world":
        with Communicator(WORLD) as comm:
            yield comm
        return
    if WORLD.size not in ODD_BLOCKS:
        pytest.skip(f"odd blocks are cut from 4 or 8 ranks; {WORLD.size} ranks run as the world")
    raw = block_of(ODD_BLOCKS[WORLD.size])
    try:
        if raw.Get_size() == 1:
            pytest.skip("this rank is a block of one")
        with Communicator(raw) as comm:
            yield comm
    finally:
        raw.Free()


#: Run a test on COMM_WORLD and on the odd blocks.
ON_ODD = pytest.mark.parametrize("comm", ["world", "odd"], indirect=True)


def _mlp(seed=0):
    torch.manual_seed(seed)  # the same initial model on every rank
    return torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def _batches(steps, seed=1):
    """This rank's own data: different on every rank, the same for both runs."""
    g = torch.Generator().manual_seed(seed * 1000 + WORLD.rank)
    return [(torch.randn(8, 12, generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(steps)]


def _train_step(model, x, y):
    torch.nn.functional.cross_entropy(model(x), y).backward()


@pytest.mark.filterwarnings("ignore:When period is 1:UserWarning")
@pytest.mark.parametrize("period", [1, 3])
def test_local_sgd_matches_periodic_model_averager(torch_distributed, comm, period):
    ours, reference = _mlp(), _mlp()
    opt = torch.optim.SGD(ours.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    algo = create("local_sgd", ours, opt, comm, period=period)
    averager = PeriodicModelAverager(period=period, warmup_steps=period - 1)
    for x, y in _batches(10):
        algo.zero_grad()
        _train_step(ours, x, y)
        algo.step()
        ref_opt.zero_grad()
        _train_step(reference, x, y)
        ref_opt.step()
        averager.average_parameters(reference.parameters())
    for p, q in zip(ours.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6)
    # After the last averaging step (t = 8 for period 3, every step for 1)
    # replicas agree; local steps since then make them differ again.
    gathered = WORLD.allgather(torch.cat([p.detach().reshape(-1) for p in ours.parameters()]))
    if WORLD.size > 1:
        assert (period == 1) == all(torch.equal(g, gathered[0]) for g in gathered)


@pytest.mark.parametrize("bucket_cap_mb", [25.0, 0.0005])
def test_allreduce_sgd_matches_ddp(torch_distributed, comm, bucket_cap_mb):
    # Different initial models on every rank: both must start from rank 0's.
    ours, reference = _mlp(seed=WORLD.rank), _mlp(seed=WORLD.rank)
    opt = torch.optim.SGD(ours.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    ddp = DistributedDataParallel(reference, bucket_cap_mb=bucket_cap_mb)
    with create("allreduce_sgd", ours, opt, comm, bucket_cap_mb=bucket_cap_mb) as algo:
        assert (len(algo.buckets) > 1) == (bucket_cap_mb < 0.001)
        for step, (x, y) in enumerate(_batches(6)):
            algo.zero_grad()
            ref_opt.zero_grad()
            if step % 2:  # gradient accumulation: two micro-batches, one allreduce
                with algo.no_sync():
                    _train_step(ours, x[:4], y[:4])
                with ddp.no_sync():
                    _train_step(ddp, x[:4], y[:4])
                x, y = x[4:], y[4:]
            _train_step(ours, x, y)
            _train_step(ddp, x, y)
            algo.step()
            ref_opt.step()
    for p, q in zip(ours.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    gathered = WORLD.allgather(torch.cat([p.detach().reshape(-1) for p in ours.parameters()]))
    assert all(torch.equal(g, gathered[0]) for g in gathered)


def _resumable_run(comm, make, batches, state=None):
    """Train on ``batches`` with the algorithm ``make(model, optimizer)``,
    after restoring ``state`` if given; returns the model and the new state."""
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    algo = make(model, opt)
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        algo.load_state_dict(state["algorithm"])
    for x, y in batches:
        algo.zero_grad()
        _train_step(model, x, y)
        algo.step()
    algo.close()
    return model, {
        "model": copy.deepcopy(model.state_dict()),
        "optimizer": copy.deepcopy(opt.state_dict()),
        "algorithm": algo.state_dict(),
    }


def test_state_dict_round_trip_continues_identically(comm):
    def make(model, opt):
        return create("local_sgd", model, opt, comm, period=3)

    batches = _batches(10)
    straight, _ = _resumable_run(comm, make, batches)
    _, halfway = _resumable_run(comm, make, batches[:4])  # between two averagings
    assert halfway["algorithm"]["steps"] == 4
    resumed, _ = _resumable_run(comm, make, batches[4:], halfway)
    for p, q in zip(straight.parameters(), resumed.parameters()):
        assert torch.equal(p, q)


def test_bad_arguments_raise_on_every_rank(comm):
    last = WORLD.rank == WORLD.size - 1
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(
        ValueError,
        match="algorithm must be one of 'adpsgd', 'allreduce_sgd', 'diloco', 'dpsgd', "
        "'eager_sgd', 'ensemble_sync', 'hierarchical_sgd', 'local_sgd', "
        "'sgp', 'streaming_diloco', 'wagma'",
    ):
        create("gossip" if last else "local_sgd", model, opt, comm)
    with pytest.raises(ValueError, match="period must be an int >= 1, got 0"):
        create("local_sgd", model, opt, comm, period=0 if last else 1)
    with pytest.raises(ValueError, match="periodd: not an option of local_sgd; its options: period, reallocate, sync"):
        create("local_sgd", model, opt, comm, periodd=2)
    other = torch.optim.SGD(_mlp().parameters(), lr=0.1)
    with pytest.raises(ValueError, match="optimizer must own only the model's parameters"):
        create("local_sgd", model, other if last else opt, comm)
    if WORLD.size > 1:
        wider = torch.nn.Sequential(torch.nn.Linear(12, 17 if last else 16))
        last_shape = f"rank {WORLD.size - 1}: 0.weight (17, 12) float32"
        with pytest.raises(
            ValueError,
            match=re.escape(
                "the model's parameters differ across ranks; parameter 0 is rank 0: 0.weight (16, 12) float32"
            )
            + ".*"
            + re.escape(last_shape),
        ):
            create("local_sgd", wider, torch.optim.SGD(wider.parameters(), lr=0.1), comm)
    assert set(ALGORITHMS) == {
        "adpsgd",
        "allreduce_sgd",
        "diloco",
        "dpsgd",
        "eager_sgd",
        "ensemble_sync",
        "hierarchical_sgd",
        "local_sgd",
        "sgp",
        "streaming_diloco",
        "wagma",
    }


POW2 = WORLD.size & (WORLD.size - 1) == 0


def _flat_params(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def test_allreduce_sgd_and_local_sgd_with_period_1_agree_within_rounding(comm):
    """Equal in exact arithmetic: SGD with momentum and weight decay is linear in the gradient and
    the model, so averaging the models after every step is averaging the gradients before it
    (no BatchNorm here).  In float32 they part by rounding: a few ulps of the parameters
    (about 1e-7 of their size) per step; 24 steps, each allowed 4e-7 of the largest parameter.
    The accuracy claims' rows check the same pair on the accuracy task, within the seed spread."""
    steps = 24
    models = [_mlp(), _mlp()]
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4) for m in models]
    algos = [
        create("allreduce_sgd", models[0], optimizers[0], comm),
        create("local_sgd", models[1], optimizers[1], comm, period=1),
    ]
    for x, y in _batches(steps):
        for algo, model in zip(algos, models):
            algo.zero_grad()
            _train_step(model, x, y)
            algo.step()
    for algo in algos:
        algo.close()
    a, b = _flat_params(models[0]), _flat_params(models[1])
    assert not torch.equal(_flat_params(_mlp()), a), "the models trained"
    assert (a - b).abs().max() <= steps * 4e-7 * a.abs().max()


def test_wagma_with_both_switches_off_equals_local_sgd(comm):
    ours, reference = _mlp(), _mlp()
    opt = torch.optim.SGD(ours.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    wagma = create("wagma", ours, opt, comm, group_size=WORLD.size, tau=3, wait_avoiding=False, group_averaging=False)
    local = create("local_sgd", reference, ref_opt, comm, period=3)
    for x, y in _batches(8):
        for algo, model in ((wagma, ours), (local, reference)):
            algo.zero_grad()
            _train_step(model, x, y)
            algo.step()
    assert torch.equal(_flat_params(ours), _flat_params(reference))


@ON_ODD
@pytest.mark.parametrize("switch", ["group_averaging", pytest.param("wait_avoiding", marks=pytest.mark.timing)])
def test_wagma_reaches_consensus_with_zero_learning_rate(comm, switch, record_measurement):
    model = _mlp(seed=comm.rank)  # a different initial model on every rank
    initial = comm.data.allgather(_flat_params(model))
    average = torch.stack(initial).mean(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    options = dict(
        group_size=max(1, comm.size // 2),
        tau=5,
        wait_avoiding=switch == "wait_avoiding",
        group_averaging=switch == "group_averaging",
    )
    with create("wagma", model, opt, comm, init_sync=False, **options) as algo:
        for x, y in _batches(10):  # steps 4 and 9 are sync steps
            algo.zero_grad()
            _train_step(model, x, y)
            algo.step()
    final = comm.data.allgather(_flat_params(model))
    assert all(torch.equal(f, final[0]) for f in final)  # consensus
    if switch == "group_averaging":  # mass-conserving: exactly the average
        torch.testing.assert_close(final[0], average, rtol=1e-6, atol=1e-6)
    else:
        # A stale step, (sum + W'_t) / (S + 1), mixes convexly but does not keep
        # the sum: the consensus stays inside the initial models' range (the
        # guarantee) and near their average.  How near depends on who was
        # stale: over 80 runs on 4 ranks 0-12 % of the spread (median 5.7 %),
        # over 20 on 8 ranks 1.5-4.5 % (results/failure-rates); an earlier
        # "1-9 %" came from a handful of runs.  0.25 is twice the largest
        # distance measured, a margin for a tail sampled 80 times.
        low, high = torch.stack(initial).min(0).values, torch.stack(initial).max(0).values
        assert bool(((final[0] >= low - 1e-6) & (final[0] <= high + 1e-6)).all())
        if comm.size > 1:
            distance = float((final[0] - average).abs().mean() / (high - low).mean())
            record_measurement("distance to the initial average / spread", distance, 0.25)
            assert distance < 0.25


@pytest.mark.parametrize("switch", ["group_averaging", pytest.param("wait_avoiding", marks=pytest.mark.timing)])
def test_wagma_with_fixed_groups_averages_in_iteration_0s_groups(comm, switch):
    """``fixed_groups`` (ablation 2) on both paths: with lr = 0 and no global
    average in 6 steps, a rank's model only mixes with iteration 0's group
    (for powers of two blocks of S consecutive ranks): with the blocking
    groups exactly the mean of the members' previous models, added in the
    schedule's order as the emulator adds them (folded ranks first; the
    exact mean of small integers at the first step), inside its members'
    range with the wait-avoiding ones (a stale step mixes convexly); the
    dynamic groups mix in other ranks from step 1."""
    S = max(1, WORLD.size // 2)
    grouping = ButterflyGrouping(WORLD.size, S, dynamic=False)
    members = grouping.group_of(0, WORLD.rank)
    if POW2:
        assert members == list(range(WORLD.rank // S * S, WORLD.rank // S * S + S))
    model = _mlp()
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):  # small integers: exact means
            p.copy_(torch.arange(p.numel()).reshape(p.shape) % 7 + 8 * WORLD.rank + i)
    initial = WORLD.allgather(_flat_params(model))
    group = torch.stack([initial[q] for q in members])
    previous = initial
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with create(
        "wagma",
        model,
        opt,
        comm,
        group_size=S,
        tau=100,
        fixed_groups=True,
        init_sync=False,
        wait_avoiding=switch == "wait_avoiding",
        group_averaging=switch == "group_averaging",
    ) as algo:
        x, y = _batches(1)[0]
        for _ in range(6):
            algo.zero_grad()
            _train_step(model, x, y)
            algo.step()
            final = _flat_params(model)
            if switch == "group_averaging":
                folds = _folds(grouping, 0, members)
                mean = _butterfly_mean({q: previous[q].clone() for q in members}, grouping.masks(0), folds)
                assert torch.equal(final, mean)
                if previous is initial:
                    assert torch.equal(final, group.sum(0) * (1.0 / len(members)))
                previous = WORLD.allgather(final)
            else:
                low, high = group.min(0).values, group.max(0).values
                assert bool(((final >= low - 1e-4) & (final <= high + 1e-4)).all())  # float32 rounding


def test_wagma_resumes_its_schedule(comm):
    def make(model, opt):
        return create(
            "wagma", model, opt, comm, group_size=min(2, WORLD.size), tau=4, wait_avoiding=False, group_averaging=True
        )

    batches = _batches(9)
    straight, _ = _resumable_run(comm, make, batches)
    _, halfway = _resumable_run(comm, make, batches[:5])
    resumed, _ = _resumable_run(comm, make, batches[5:], halfway)
    assert torch.equal(_flat_params(straight), _flat_params(resumed))


def test_wagma_refuses_both_switches(comm):
    model = _mlp()
    with pytest.raises(ValueError, match="wait_avoiding and group_averaging cannot both be on"):
        create(
            "wagma",
            model,
            torch.optim.SGD(model.parameters(), lr=0.1),
            comm,
            group_size=1,
            wait_avoiding=True,
            group_averaging=True,
        )


def _averaging_only(comm, name, steps, **options):
    """``steps`` steps of algorithm ``name`` with learning rate 0 from a
    different model on every rank, so that only the averaging moves the
    parameters.  Returns the model, the algorithm and every rank's initial
    parameters."""
    model = _mlp(seed=comm.rank)
    initial = comm.data.allgather(_flat_params(model))
    algo = create(name, model, torch.optim.SGD(model.parameters(), lr=0.0), comm, init_sync=False, **options)
    x, y = _batches(1)[0]
    for _ in range(steps):
        algo.zero_grad()
        _train_step(model, x, y)
        algo.step()
    return model, algo, initial


def test_dpsgd_reaches_the_initial_average_with_zero_learning_rate(comm):
    # Ring of 8: the error shrinks by 0.81 per step.
    model, _, initial = _averaging_only(comm, "dpsgd", 120)
    average = torch.stack(initial).mean(0)
    for final in WORLD.allgather(_flat_params(model)):
        torch.testing.assert_close(final, average, rtol=1e-5, atol=1e-5)


def test_dpsgd_mixes_with_the_two_ring_neighbours(comm):
    # One step, lr = 0, on a model whose parameters all equal the rank.
    model = torch.nn.Linear(2, 1)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float(WORLD.rank))
    algo = create("dpsgd", model, torch.optim.SGD(model.parameters(), lr=0.0), comm, init_sync=False)
    model(torch.ones(1, 2)).sum().backward()
    algo.step()
    P, r = WORLD.size, WORLD.rank
    expected = r if P == 1 else (r + (r - 1) % P + (r + 1) % P) / 3
    assert torch.allclose(_flat_params(model), torch.full((3,), float(expected)))


@pytest.mark.parametrize(
    "peers",
    [
        1,
        2,
        pytest.param(3, marks=pytest.mark.skipif(WORLD.size < 5, reason="three distinct out-peers 2**k need P >= 5")),
    ],
)
def test_sgp_conserves_mass_and_reaches_the_initial_average(comm, peers):
    model = _mlp(seed=WORLD.rank)
    total = torch.stack(WORLD.allgather(_flat_params(model))).sum(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    algo = create("sgp", model, opt, comm, peers=peers, init_sync=False)
    x, y = _batches(1)[0]
    rounds = max(1, (WORLD.size - 1).bit_length())
    for step in range(30):  # two peers on 2 or 4 ranks contract by 1/3 a step
        algo.zero_grad()
        _train_step(model, x, y)
        algo.step()
        # Mass conservation: the sum over ranks of x = w z never changes.
        mass = torch.stack(WORLD.allgather(_flat_params(model) * algo.weight.item())).sum(0)
        torch.testing.assert_close(mass, total, rtol=1e-5, atol=1e-5)
        if peers == 1 and POW2 and step == rounds - 1:
            # d steps of the one-peer exponential graph average exactly.
            for z in WORLD.allgather(_flat_params(model)):
                torch.testing.assert_close(z, total / WORLD.size, rtol=1e-5, atol=1e-6)
    assert algo.weight.item() == 1.0  # a regular graph keeps w = 1
    for z in WORLD.allgather(_flat_params(model)):
        torch.testing.assert_close(z, total / WORLD.size, rtol=1e-5, atol=1e-5)


@pytest.mark.filterwarnings("ignore:When the maximum period:UserWarning")
def test_hierarchical_sgd_matches_hierarchical_model_averager(torch_distributed, comm):
    P = WORLD.size
    levels = {2: 2 if P % 2 == 0 else 1, 6: P} if P > 1 else {2: 1}
    ours, reference = _mlp(seed=WORLD.rank), _mlp(seed=WORLD.rank)
    opt = torch.optim.SGD(ours.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    averager = HierarchicalModelAverager(levels, warmup_steps=3)
    with create(
        "hierarchical_sgd", ours, opt, comm, period_group_size_dict=levels, warmup_steps=3, init_sync=False
    ) as algo:  # the reference's different starts
        for step, (x, y) in enumerate(_batches(13)):
            algo.zero_grad()
            _train_step(ours, x, y)
            algo.step()
            ref_opt.zero_grad()
            _train_step(reference, x, y)
            if step < 3:  # warm-up: synchronous gradient averaging
                for p in reference.parameters():
                    dist.all_reduce(p.grad)
                    p.grad /= P
            ref_opt.step()
            averager.average_parameters(reference.parameters())
    for p, q in zip(ours.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_hierarchical_sgd_refuses_bad_levels(comm):
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(
        ValueError,
        match=re.escape(f"the last group size in period_group_size_dict must be all {WORLD.size} ranks ('P')"),
    ):
        create("hierarchical_sgd", model, opt, comm, period_group_size_dict={2: WORLD.size + 1})
    with pytest.raises(ValueError, match="periods must be increasing"):
        create("hierarchical_sgd", model, opt, comm, period_group_size_dict={4: 1, 2: WORLD.size})


@pytest.mark.timing  # its communication thread meets the neighbours in the OS's order
@ON_ODD
def test_adpsgd_conserves_mass_and_reaches_consensus(comm):
    # 200 steps: 100 rounds of right-left exchanges on the ring (on an odd
    # ring ranks P - 2 and P - 1 exchange in every other step, with rank 0).
    model, algo, initial = _averaging_only(comm, "adpsgd", 200)
    total = torch.stack(initial).sum(0)
    algo.close()  # every requested exchange done, on every rank
    final = comm.data.allgather(_flat_params(model))
    torch.testing.assert_close(torch.stack(final).sum(0), total, rtol=1e-5, atol=1e-5)
    for f in final:
        torch.testing.assert_close(f, total / comm.size, rtol=1e-4, atol=1e-4)
    assert algo.gossip is None


def test_adpsgd_checkpoints_the_differences_its_exchanges_have_not_folded_in(comm):
    # A checkpoint holds the half differences added since the last update (none yet: zeros);
    # restored, they are folded in at the next update or, here, at close(): exactly once.
    model = _mlp()
    algo = create("adpsgd", model, torch.optim.SGD(model.parameters(), lr=0.1), comm)
    with algo.lock:
        state = {"model": copy.deepcopy(model.state_dict()), "algorithm": algo.state_dict()}
    algo.close()
    assert [p.shape for p in state["algorithm"]["pending"]] == [p.shape for p in algo.flat.params.values()]
    assert all(not p.any() for p in state["algorithm"]["pending"])
    state["algorithm"]["pending"] = [torch.full_like(p, WORLD.rank + 0.5) for p in state["algorithm"]["pending"]]
    restored = _mlp()
    again = create("adpsgd", restored, torch.optim.SGD(restored.parameters(), lr=0.1), comm)
    restored.load_state_dict(state["model"])
    again.load_state_dict(state["algorithm"])
    before = _flat_params(restored)
    again.close()
    assert torch.equal(_flat_params(restored), before + (WORLD.rank + 0.5))


@pytest.mark.timing
@pytest.mark.parametrize(
    "comm, quorum", [("world", "solo"), ("world", "majority"), ("world", "half"), ("odd", "half")], indirect=["comm"]
)
def test_eager_sgd_keeps_replicas_identical(comm, quorum):
    model = _mlp(seed=comm.rank)  # different on every rank: rank 0's is broadcast
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with create("eager_sgd", model, opt, comm, quorum=quorum, limiter=4) as algo:
        for step, (x, y) in enumerate(_batches(12)):
            algo.zero_grad()
            _train_step(model, x, y)
            if comm.rank == step % comm.size:
                time.sleep(0.02)  # a different late rank at every step
            algo.step()
    final = comm.data.allgather(_flat_params(model))
    assert all(torch.equal(f, final[0]) for f in final)
    assert not torch.equal(final[0], _flat_params(_mlp(seed=0)))  # it trained


@pytest.mark.timing
@pytest.mark.parametrize(
    "comm, late", [("world", "drop"), ("world", "accumulate"), ("odd", "accumulate")], indirect=["comm"]
)
def test_eager_sgd_applies_the_gradients_its_reading_promises(comm, late, record_measurement):
    """With plain SGD the model moves by lr times the sum of the averages
    applied.  ``"drop"``: that sum is the sum over ranks of the gradients of
    the steps at which the rank was fresh, divided by P (a late gradient is
    never applied); ``"accumulate"``: of every gradient computed, less what
    the ranks still hold at the end (none is lost or counted twice).  With
    random per-step delays (up to 20 ms, late ranks at most steps) and a
    limiter of 5 (every sixth step waits for all), in float64: the two
    sides differ by rounding alone."""
    model = _mlp().double()
    lr, steps = 0.05, 40
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    start = _flat_params(model).clone()
    expected = torch.zeros_like(start)
    delays = np.random.default_rng([3, comm.rank]).random(steps) * 0.02
    with create("eager_sgd", model, opt, comm, quorum="solo", late=late, limiter=5) as algo:
        for step, (x, y) in enumerate(_batches(steps)):
            algo.zero_grad()
            _train_step(model, x.double(), y)
            grad = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
            time.sleep(delays[step])  # injected imbalance
            stale_before = algo.stale_steps
            algo.step()
            if late == "accumulate" or algo.stale_steps == stale_before:
                expected += grad
        stale = algo.stale_steps
    (unapplied,) = algo.unapplied.values()
    if unapplied is not None:
        expected -= torch.as_tensor(unapplied)
    assert late == "accumulate" or unapplied is None
    total = torch.from_numpy(comm.data.allreduce(expected.numpy()))
    applied = (start - _flat_params(model)) / lr * comm.size
    torch.testing.assert_close(applied, total, rtol=1e-9, atol=1e-9)
    if comm.size > 1:
        late_steps = comm.data.allreduce(stale)
        record_measurement("stale steps over all ranks", late_steps, 1, above=True)
        assert late_steps > 0  # some gradient was late


def test_parameters_on_two_devices_are_refused_on_every_rank(comm):
    model = _mlp()
    if WORLD.rank == WORLD.size - 1:
        model[2].bias = torch.nn.Parameter(torch.zeros(3, device="meta"))
    with pytest.raises(ValueError, match="model parameters must all be on one device, got cpu, meta"):
        create("local_sgd", model, torch.optim.SGD(model.parameters(), lr=0.1), comm)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize(
    "name, options",
    [
        ("allreduce_sgd", {}),
        ("local_sgd", {"period": 2}),
        ("dpsgd", {}),
        ("sgp", {}),
        ("wagma", {"group_size": 1, "tau": 2}),
        ("eager_sgd", {}),
        ("adpsgd", {}),
        ("hierarchical_sgd", {"period_group_size_dict": {2: WORLD.size}}),
    ],
)
def test_cuda_models_keep_their_flat_buffers_on_the_device(comm, name, options):
    model = _mlp(seed=WORLD.rank).cuda()
    algo = create(name, model, torch.optim.SGD(model.parameters(), lr=0.1), comm, **options)
    for x, y in _batches(4):
        algo.zero_grad()
        _train_step(model, x.cuda(), y.cuda())
        algo.step()
    algo.close()
    assert all(t.is_cuda for t in algo.flat.params.values())
    assert all(p.is_cuda and torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize(
    "options, text",
    [
        ({"group_size": WORLD.size + 1}, f"group_size must be an int from 1 to {WORLD.size} ranks"),
        ({"group_size": 1, "tau": 0}, "tau must be an int >= 1, got 0"),
        ({"group_size": 1, "fixed_groups": "yes"}, "fixed_groups must be True or False, got 'yes'"),
        (
            {"group_size": 1, "wait_avoiding": False, "fixed_groups": True},
            "fixed_groups needs wait_avoiding or group_averaging",
        ),
    ],
)
def test_wagma_bad_options_raise_on_every_rank(comm, options, text):
    model = _mlp()
    with pytest.raises(ValueError, match=text):
        create("wagma", model, torch.optim.SGD(model.parameters(), lr=0.1), comm, **options)
