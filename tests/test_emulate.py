"""The emulator (wagma.emulate): P replicas in one process, their contributions ordered by a schedule."""

import copy

import numpy as np
import pytest
import torch

from wagma.emulate import Emulator, Schedule, simulated_schedule
from wagma.emulate.schedule import exchanges_from_times
from wagma.options import resolved_options
from wagma.sim import Network, Scenario
from wagma.sim.kernels import LATE_CODES, _taken

NET = Network(alpha=2e-6, beta=1 / 9e9)
RANKS, STEPS, FEATURES, CLASSES, BATCH = 8, 24, 12, 4, 8


def scenario(ranks=RANKS, steps=STEPS, imbalance="random:k=2,ms=320", seed=3):
    return Scenario(
        ranks=ranks, steps=steps, network=NET, parameters=1000, imbalance=imbalance, compute_ms=600.0, seed=seed
    )


class Task:
    """P replicas of a small classifier, each with its own SGD with momentum
    and weight decay, and its own batches: one per (rank, step)."""

    def __init__(self, ranks=RANKS, steps=STEPS, seed=0):
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.Tanh(), torch.nn.Linear(16, CLASSES))
        self.models = [copy.deepcopy(model) for _ in range(ranks)]
        self.optimizers = [
            torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4) for m in self.models
        ]
        g = torch.Generator().manual_seed(seed + 1)
        self.x = torch.randn(ranks, steps, BATCH, FEATURES, generator=g)
        self.y = torch.randint(0, CLASSES, (ranks, steps, BATCH), generator=g)

    def gradient(self, r, t):
        loss = torch.nn.functional.cross_entropy(self.models[r](self.x[r, t]), self.y[r, t])
        loss.backward()
        return loss.item()


def emulate(schedule, seed=0, **run):
    task = Task(schedule.ranks, schedule.steps, seed)
    emulator = Emulator(schedule, task.models, task.optimizers)
    loss = emulator.run(task.gradient, **run)
    return emulator, loss


def synchronous(algorithm, ranks=RANKS, steps=STEPS, **options):
    """The schedule of an algorithm whose arithmetic does not depend on the times."""
    return Schedule(
        algorithm,
        resolved_options(algorithm, ranks, options).as_dict(),
        ranks,
        steps,
        {},
        np.zeros((ranks, steps)),
        "test",
    )


def params(emulator):
    return torch.stack([f.params[torch.float32] for f in emulator.flats])


@pytest.mark.parametrize("algorithm", ["wagma", "eager_sgd", "adpsgd", "sgp"])
def test_the_same_schedule_gives_the_same_replicas_bitwise(algorithm):
    schedule = simulated_schedule(algorithm, scenario())
    a, loss_a = emulate(schedule)
    b, loss_b = emulate(schedule)
    assert torch.equal(params(a), params(b)) and np.array_equal(loss_a, loss_b)


def test_wagma_without_both_switches_is_local_sgd_with_period_tau_bitwise():
    off = simulated_schedule("wagma", scenario(), wait_avoiding=False, group_averaging=False, tau=6)
    local = synchronous("local_sgd", period=6)
    assert torch.equal(params(emulate(off)[0]), params(emulate(local)[0]))


def test_wagma_with_every_rank_fresh_is_the_blocking_group_average_bitwise():
    # No imbalance: every rank arrives at once, so no version begins before anyone's arrival.
    fresh = simulated_schedule("wagma", scenario(imbalance="none"), tau=5)
    assert not fresh.stale.any()
    blocking = simulated_schedule("wagma", scenario(imbalance="none"), tau=5, wait_avoiding=False, group_averaging=True)
    assert torch.equal(params(emulate(fresh)[0]), params(emulate(blocking)[0]))


def test_wagma_stale_members_take_their_older_contribution_and_the_stale_average():
    schedule = simulated_schedule("wagma", scenario(), tau=100)  # no sync step: the groups alone
    stale = schedule.stale
    assert 0.2 < stale.mean() < 0.9, "the imbalance makes some contributions stale, not all"
    emulator, _ = emulate(schedule)
    assert np.array_equal(emulator.stale_steps, stale.sum(axis=1))
    # A sync step (tau) makes every replica the average; here the replicas differ.
    assert not torch.equal(params(emulator)[0], params(emulator)[1])


def test_a_sync_step_makes_every_replica_equal():
    emulator, _ = emulate(simulated_schedule("wagma", scenario(), tau=8))  # steps 7, 15, 23: the last
    p = params(emulator)
    assert torch.equal(p, p[:1].expand_as(p))


def test_eager_sgd_with_every_rank_fresh_is_allreduce_sgd_bitwise():
    fresh = simulated_schedule("eager_sgd", scenario(imbalance="none"))
    assert not fresh.stale.any()
    assert torch.equal(params(emulate(fresh)[0]), params(emulate(synchronous("allreduce_sgd"))[0]))


@pytest.mark.parametrize("late", ["drop", "newest", "accumulate"])
def test_eager_sgd_replicas_stay_equal_under_every_late_reading(late):
    schedule = simulated_schedule("eager_sgd", scenario(), late=late)
    assert schedule.stale.any()
    p = params(emulate(schedule)[0])
    assert torch.equal(p, p[:1].expand_as(p))


def test_late_readings_decide_which_version_reads_a_late_gradient():
    # Rank 1's step-0 gradient is published at 1.5, after version 0 began (1.0) and before
    # version 1 (2.0); its step-1 gradient at 1.8, fresh for version 1.  Rank 0 is always fresh.
    finish = np.array([[0.5, 1.5, 2.5], [1.5, 1.8, 2.6]])
    begins = np.array([1.0, 2.0, 3.0])
    taken = {late: _taken(finish, begins, code) for late, code in LATE_CODES.items()}
    assert taken["drop"][1].tolist() == [-1, 1, 2]  # the late one is dropped
    assert taken["newest"][1].tolist() == [-1, 1, 2]  # replaced by the fresh one before version 1
    assert taken["accumulate"][1].tolist() == [1, 1, 2]  # summed into version 1
    assert all(t[0].tolist() == [0, 1, 2] for t in taken.values())
    # Published after version 1 began too (2.2): newest keeps it for version 2, drop loses it.
    finish[1] = [1.5, 2.2, 2.6]
    assert _taken(finish, begins, LATE_CODES["newest"])[1].tolist() == [1, -1, 2]
    assert _taken(finish, begins, LATE_CODES["drop"])[1].tolist() == [-1, -1, 2]
    assert _taken(finish, begins, LATE_CODES["accumulate"])[1].tolist() == [1, 2, 2]


def test_allreduce_sgd_and_local_sgd_with_period_1_agree_within_rounding():
    # Equal in exact arithmetic: SGD with momentum and weight decay is linear in the gradient and
    # the model, so averaging the models after the step is averaging the gradients before it
    # (no BatchNorm here).  In float32 they differ by rounding: a few ulps of the parameters
    # (about 1e-7 of their size) per step, here 24 steps.
    a = params(emulate(synchronous("allreduce_sgd"))[0])
    b = params(emulate(synchronous("local_sgd", period=1))[0])
    assert (a - b).abs().max() <= 24 * 4e-7 * a.abs().max()


@pytest.mark.parametrize("algorithm", ["dpsgd", "sgp", "adpsgd"])
def test_gossip_keeps_the_average_of_the_replicas_and_brings_them_together(algorithm):
    # With a learning rate of 0 only the communication moves the replicas: the mixing is doubly
    # stochastic (D-PSGD's ring, SGP's exponential graph, AD-PSGD's pairwise averages), so their
    # mean stays (to float32 rounding of the 16-element sums) and the spread shrinks.
    schedule = synchronous(algorithm) if algorithm != "adpsgd" else simulated_schedule("adpsgd", scenario())
    task = Task()
    start = torch.stack([torch.nn.utils.parameters_to_vector(m.parameters()) for m in task.models])
    with torch.no_grad():
        for r, m in enumerate(task.models):  # different models to start from
            for p in m.parameters():
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(r)))
    before = torch.stack([torch.nn.utils.parameters_to_vector(m.parameters()) for m in task.models])
    assert not torch.equal(before, start)
    emulator = Emulator(schedule, task.models, task.optimizers)
    emulator.run(task.gradient, lr=lambda t: 0.0)
    after = params(emulator)
    assert torch.allclose(after.mean(0), before.mean(0), atol=1e-5)
    assert (after - after.mean(0)).abs().max() < 0.1 * (before - before.mean(0)).abs().max()


def test_adpsgd_exchanges_are_read_from_the_simulated_times():
    # Rank 0 (active) ends its steps at 1 and 3, rank 1 at 2 and 4; exchanges of 1 s begin at
    # 1.5 and 3.5.  Rank 0 copies at the begin and adds its difference at the end (1.5, 2.5:
    # after 1 update both; 3.5, 4.5: after 2); rank 1 does both when the request arrives (2.0
    # and 4.0: after 1 and 2 updates, an update at the same time coming first).
    finish = np.array([[1.0, 3.0], [2.0, 4.0]])
    begin = np.array([[1.5, 3.5], [0.0, 0.0]])
    partner = np.array([[1, 1], [0, 0]])
    table = exchanges_from_times(partner, begin, finish, 1.0)
    assert table.tolist() == [[0, 1, 1, 1, 1], [0, 1, 1, 2, 2], [1, 0, 0, 1, 1], [1, 0, 0, 2, 2]]


def test_adpsgd_replays_each_replica_s_order_of_steps_and_exchanges():
    # One parameter w per replica, loss w^2 / 2, plain SGD with lr 0.5: a step halves w.  Rank 0
    # (w = 4) steps to 2 and copies it; rank 1 (w = 0), before its first step, adds
    # (2 - 0) / 2 = 1 to its pending difference, which its first step folds in: 0 -> 0 + 1,
    # then its second step halves it (0.5).  Rank 0 adds its difference (0 - 2) / 2 = -1
    # only after its second step (2 -> 1), at the close: 0.  Any other order gives other values.
    models = [torch.nn.Linear(1, 1, bias=False) for _ in range(2)]
    with torch.no_grad():
        models[0].weight.fill_(4.0)
        models[1].weight.fill_(0.0)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.5) for m in models]
    exchanges = np.array([[0, 1, 1, 1, 2], [1, 0, 0, 0, 0]])
    schedule = Schedule("adpsgd", {}, 2, 2, {"exchanges": exchanges}, np.zeros((2, 2)), "test")
    seen = []

    def gradient(r, t):
        w = models[r].weight
        seen.append((r, t, w.item()))
        (w * w / 2).sum().backward()
        return 0.0

    Emulator(schedule, models, optimizers).run(gradient, after_step=lambda t: seen.append(("all", t)))
    assert [m.weight.item() for m in models] == [0.0, 0.5]
    # Each replica's gradients at its model then; the slower replica goes first.
    assert seen == [(0, 0, 4.0), (1, 0, 0.0), ("all", 0), (0, 1, 2.0), (1, 1, 1.0), ("all", 1)]


def test_adpsgd_exchanges_not_of_one_run_are_refused():
    task = Task(ranks=2, steps=2)
    # Rank 1 serves after its second update an exchange whose active side waits for it after
    # its first: in no real run.
    unordered = np.array([[0, 1, 1, 0, 0], [1, 0, 0, 2, 2], [0, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    schedule = Schedule("adpsgd", {}, 2, 2, {"exchanges": unordered}, np.zeros((2, 2)), "test")
    with pytest.raises(ValueError, match="cannot be ordered"):
        Emulator(schedule, task.models, task.optimizers).run(task.gradient)


def test_bad_input_is_refused_with_what_was_given():
    with pytest.raises(ValueError, match="the emulator runs .*got 'ensemble_sync'"):
        Emulator(synchronous("ensemble_sync"), [], [])
    task = Task(ranks=2)
    with pytest.raises(ValueError, match="schedule is of 8 ranks.*got 2 and 2"):
        Emulator(synchronous("dpsgd"), task.models, task.optimizers)
    with pytest.raises(ValueError, match="needs source"):
        Schedule("wagma", {"wait_avoiding": True}, 2, 2, {}, np.zeros((2, 2)), "test")


@pytest.mark.parametrize("ranks, group_size", [(6, 3), (7, 2), (5, 2)])
def test_wagma_on_any_world_averages_in_the_runtimes_groups(ranks, group_size):
    """P not a power of two: with every rank fresh and a learning rate of 0,
    step t makes each replica the mean of its group of iteration t
    (:class:`~collectives.wait_avoiding.groups.ButterflyGrouping`, folded
    ranks included; exact, the parameters being small integers), and a
    stale member's average divides by its group's size."""
    from collectives.wait_avoiding.groups import ButterflyGrouping

    steps = 3
    options = resolved_options("wagma", ranks, {"group_size": group_size, "tau": 100}).as_dict()
    fresh = np.tile(np.arange(steps), (ranks, 1))
    schedule = Schedule("wagma", options, ranks, steps, {"source": fresh}, np.zeros((ranks, steps)), "test")
    task = Task(ranks, steps)
    with torch.no_grad():
        for r, m in enumerate(task.models):
            for p in m.parameters():
                p.copy_(torch.arange(p.numel()).reshape(p.shape) % 7 + 10 * r)
    expected = torch.stack([torch.nn.utils.parameters_to_vector(m.parameters()).detach() for m in task.models])
    emulator = Emulator(schedule, task.models, task.optimizers)
    emulator.run(task.gradient, lr=lambda t: 0.0)
    grouping = ButterflyGrouping(ranks, group_size)
    for t in range(steps):
        for group in grouping.groups(t):
            expected[group] = expected[group].sum(0) * (1.0 / len(group))
    assert torch.equal(params(emulator), expected)
    assert any(len(g) != group_size for g in grouping.groups(0)) or ranks % group_size == 0
