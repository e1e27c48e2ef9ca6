"""A user's own training loop, DDP's contract kept by every algorithm (real MPI ranks, real torch models).

What is checked, per algorithm where it applies: the replicas start from
rank 0's parameters and buffers; frozen parameters never change and keep
None gradients; clipping between ``backward()`` and ``step()`` bounds every
update, and for Allreduce-SGD clips the global gradient, which
``backward()`` has already averaged; gradient accumulation is
deterministic with and without ``no_sync()``; a ``GradScaler`` with bf16
autocast skips the same steps on every rank where the gradients are
averaged; and each misuse raises its message on every rank, none hanging.
"""

import copy
import math
import re

import pytest
import torch
from mpi4py import MPI

from collectives import Communicator
from wagma.algorithms import ALGORITHMS, create

pytestmark = pytest.mark.mpi

WORLD = MPI.COMM_WORLD
P = WORLD.size

#: Options that make each algorithm do its communication within a few steps.
OPTIONS = {
    "allreduce_sgd": {"bucket_cap_mb": 1e-4},  # one bucket per parameter
    "local_sgd": {"period": 2},
    "wagma": {"tau": 3},
    "dpsgd": {},
    "adpsgd": {},
    "sgp": {},
    "eager_sgd": {},
    "hierarchical_sgd": {"warmup_steps": 2},
    "ensemble_sync": {"period": 2, "timeout_s": 60.0},
    "diloco": {"period": 2},
    "streaming_diloco": {"period": 2, "fragments": 2, "overlap_steps": 1},
}


EVERY = sorted(ALGORITHMS)


@pytest.fixture
def comm():
    with Communicator(WORLD) as comm:
        yield comm


def _net(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(12, 16), torch.nn.BatchNorm1d(16), torch.nn.Tanh(), torch.nn.Linear(16, 3)
    )


def _batches(steps, seed=1):
    """This rank's own data: different on every rank, the same from run to run."""
    g = torch.Generator().manual_seed(seed * 1000 + WORLD.rank)
    return [(torch.randn(8, 12, generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(steps)]


def _loss(model, x, y):
    return torch.nn.functional.cross_entropy(model(x), y)


def _vector(tensors):
    return torch.cat([t.detach().reshape(-1).clone() for t in tensors])


def _plan(algo, steps):
    algo.plan(steps, 8)  # ensemble_sync's last round waits for every rank


# ---------------------------------------------------------------- one starting model


@pytest.mark.parametrize("name", EVERY)
def test_create_makes_every_replica_rank_0s(comm, name):
    model = _net(seed=100 + WORLD.rank)  # a different model on every rank
    model(torch.randn(16, 12, generator=torch.Generator().manual_seed(WORLD.rank)))  # and BatchNorm statistics
    rank0 = WORLD.bcast({k: v.clone() for k, v in model.state_dict().items()}, root=0)
    with create(name, model, torch.optim.SGD(model.parameters(), lr=0.1), comm, **OPTIONS[name]):
        for key, value in model.state_dict().items():
            assert torch.equal(value, rank0[key]), key


def test_init_sync_false_keeps_each_rank_its_own_model(comm):
    model = _net(seed=100 + WORLD.rank)
    mine = _vector(model.parameters())
    with create("local_sgd", model, torch.optim.SGD(model.parameters(), lr=0.1), comm, init_sync=False):
        assert torch.equal(_vector(model.parameters()), mine)


# ---------------------------------------------------------------- frozen parameters


@pytest.mark.parametrize("owner", ["every parameter", "the trainable ones"])
@pytest.mark.parametrize("name", EVERY)
def test_frozen_parameters_never_change(comm, name, owner):
    """Weight decay and momentum would move a frozen weight that had a
    gradient (even a zero one): it has none, and no average touches it."""
    model = _net(seed=0)
    model[0].requires_grad_(False)
    frozen = _vector(model[0].parameters())
    trainable = _vector(model[3].parameters())
    params = model.parameters() if owner == "every parameter" else [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=0.1)
    with create(name, model, optimizer, comm, **OPTIONS[name]) as algo:
        _plan(algo, 6)
        for x, y in _batches(6):
            algo.zero_grad()
            _loss(model, x, y).backward()
            algo.step()
        assert all(p.grad is None for p in model[0].parameters())
    assert torch.equal(_vector(model[0].parameters()), frozen)
    assert not torch.equal(_vector(model[3].parameters()), trainable)


# ---------------------------------------------------------------- clipping

CLIPPED = [name for name in EVERY if name != "eager_sgd"]


@pytest.mark.parametrize("name", CLIPPED)
def test_clipping_bounds_every_update(comm, name):
    """Plain SGD with lr 1 after ``clip_grad_norm_(max_norm=c)``: every
    optimizer step moves the parameters by at most c (the update is the
    clipped gradient; 1e-4 relative covers float32 rounding of the norm).
    (Eager-SGD is left out: its average may carry a late rank's earlier,
    separately clipped gradient, which clipping does not bound.)"""
    c = 1e-3
    model = _net(seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    moves, norms, before = [], [], {}
    optimizer.register_step_pre_hook(lambda *a: before.update(x=_vector(model.parameters())))
    optimizer.register_step_post_hook(
        lambda *a: moves.append(float((_vector(model.parameters()) - before["x"]).norm()))
    )
    with create(name, model, optimizer, comm, **OPTIONS[name]) as algo:
        _plan(algo, 6)
        for x, y in _batches(6):
            algo.zero_grad()
            _loss(model, x, y).backward()
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), c)))
            algo.step()
    assert len(moves) == 6 and max(moves) <= c * (1 + 1e-4), moves
    if name == "allreduce_sgd":  # the global gradient: clipped from the same norm on every rank
        assert all(mine == theirs for mine, theirs in zip(norms, WORLD.bcast(norms, root=0)))


@pytest.mark.parametrize("zero", ["algo.zero_grad()", "optimizer.zero_grad()"])
def test_allreduce_sgd_gradients_are_the_global_average_when_backward_returns(comm, zero):
    """What a user inspects between ``backward()`` and ``step()`` is the
    average over ranks of the local gradients (computed here on a plain
    copy of the model), with either way of zeroing the gradients."""
    model = _net(seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with create("allreduce_sgd", model, optimizer, comm, bucket_cap_mb=1e-4) as algo:
        for x, y in _batches(4):
            plain = copy.deepcopy(model)
            _loss(plain, x, y).backward()
            average = torch.stack(WORLD.allgather(_vector(p.grad for p in plain.parameters()))).mean(0)
            algo.zero_grad() if zero == "algo.zero_grad()" else optimizer.zero_grad()
            _loss(model, x, y).backward()
            torch.testing.assert_close(
                _vector(p.grad for p in model.parameters()), average, rtol=1e-5, atol=1e-7
            )  # float32 sums in another order
            algo.step()


# ---------------------------------------------------------------- accumulation


def _accumulate(comm, name, no_sync, steps=4, micro=3):
    """Final parameters after ``steps`` steps of ``micro`` micro-batches each."""
    model = _net(seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    batches = _batches(steps * micro)
    with create(name, model, optimizer, comm, **OPTIONS[name]) as algo:
        _plan(algo, steps)
        for s in range(steps):
            algo.zero_grad()
            for m in range(micro):
                x, y = batches[s * micro + m]
                if no_sync and m < micro - 1:
                    with algo.no_sync():
                        _loss(model, x, y).backward()
                else:
                    _loss(model, x, y).backward()
            algo.step()
    return _vector(model.parameters())


@pytest.mark.parametrize("name", ["allreduce_sgd", "local_sgd", "hierarchical_sgd"])
def test_accumulation_is_deterministic_and_equal_with_and_without_no_sync(comm, name):
    """Bitwise the same from run to run; without ``no_sync()`` Allreduce-SGD
    averages at every pass (the average of the sums, rounded differently),
    so the two agree to float32 rounding over 4 momentum steps."""
    first = _accumulate(comm, name, no_sync=False)
    assert torch.equal(first, _accumulate(comm, name, no_sync=False))
    if name == "allreduce_sgd":
        torch.testing.assert_close(first, _accumulate(comm, name, no_sync=True), rtol=1e-5, atol=1e-6)
        assert all(torch.equal(first, other) for other in WORLD.allgather(first))  # equal replicas


def test_a_step_after_no_sync_passes_only_averages_them(comm):
    """Inside ``no_sync()`` the gradients stay local; a ``step()`` with no
    averaging pass since averages them itself, so the replicas stay equal."""
    model = _net(seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with create("allreduce_sgd", model, optimizer, comm) as algo:
        x, y = _batches(1)[0]
        algo.zero_grad()
        with algo.no_sync():
            _loss(model, x, y).backward()
        local = _vector(p.grad for p in model.parameters())
        if P > 1:
            assert not torch.equal(local, WORLD.bcast(local, root=0)) or WORLD.rank == 0
        algo.step()
        parameters = _vector(model.parameters())
    assert all(torch.equal(parameters, other) for other in WORLD.allgather(parameters))


def test_a_step_without_backward_averages_the_gradients_set_by_hand(comm):
    """No backward pass since the last step (gradients set by hand, or the
    zeros of ``experiments.train --compute emulate``): ``step()`` averages
    the gradients itself, so every replica takes the step of the global
    average (with lr 1 and gradients rank + 1 everywhere: the mean, (P + 1) / 2)."""
    model = _net(seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    start = _vector(model.parameters()).clone()
    with create("allreduce_sgd", model, optimizer, comm) as algo:
        for step in range(2):
            algo.zero_grad()
            for p in model.parameters():
                p.grad.fill_(WORLD.rank + 1)  # in place: the gradients are views of the flat buffer
            algo.step()
        parameters = _vector(model.parameters())
    torch.testing.assert_close(parameters, start - 2 * (P + 1) / 2, rtol=0, atol=1e-5)
    assert all(torch.equal(parameters, other) for other in WORLD.allgather(parameters))


# ---------------------------------------------------------------- mixed precision


@pytest.mark.parametrize("name", ["allreduce_sgd", pytest.param("eager_sgd", marks=pytest.mark.timing), "local_sgd"])
def test_grad_scaler_with_bf16_autocast(comm, name):
    """bf16 autocast on the CPU with ``algo.step(scaler)``.  At step 2 the
    last rank's loss is infinite.  Allreduce-SGD: every rank's average holds
    the inf, so every rank skips step 2 and halves its scale.  Eager-SGD
    (``late="drop"``): the inf is in step 2's version, on every rank, when
    the last rank was fresh at step 2, and dropped when it was late; so
    after every step the replicas and the scales are equal, and every rank
    halved its scale exactly when the last rank was fresh at step 2 (which
    depends on who was late, so the test is marked timing).  Local SGD:
    only the last rank skips step 2."""
    model = _net(seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    with create(name, model, optimizer, comm, **OPTIONS[name]) as algo:
        for step, (x, y) in enumerate(_batches(6)):
            algo.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = _loss(model, x, y)
                assert model[0](x).dtype == torch.bfloat16
            if step == 2 and WORLD.rank == P - 1:
                loss = loss * math.inf
            scaler.scale(loss).backward()
            if name != "eager_sgd":  # eager-SGD unscales the average inside step()
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            before, stale_before = _vector(model.parameters()), algo.stale_steps
            algo.step(scaler)
            if step == 2:
                fresh_at_2 = algo.stale_steps == stale_before
            scaler.update()
            parameters = _vector(model.parameters())
            assert bool(torch.isfinite(parameters).all())
            if name == "allreduce_sgd":
                assert torch.equal(parameters, before) == (step == 2)
            if name == "local_sgd" and step == 2:
                assert torch.equal(parameters, before) == (WORLD.rank == P - 1)
            if name != "local_sgd":
                assert all(torch.equal(parameters, other) for other in WORLD.allgather(parameters))
                assert len(set(WORLD.allgather(scaler.get_scale()))) == 1
    halved = scaler.get_scale() < 2.0**10
    if name == "eager_sgd":
        assert halved == WORLD.bcast(fresh_at_2, root=P - 1)
    else:
        assert halved == (name == "allreduce_sgd" or WORLD.rank == P - 1)


# ---------------------------------------------------------------- misuse


@pytest.mark.parametrize("name", EVERY)
def test_an_optimizer_stepped_outside_algo_step_is_caught_at_the_next_step(comm, name):
    model = _net(seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with create(name, model, optimizer, comm, **OPTIONS[name]) as algo:
        x, y = _batches(1)[0]
        algo.zero_grad()
        _loss(model, x, y).backward()
        optimizer.step()
        with pytest.raises(
            RuntimeError,
            match=re.escape(
                f"{name}: optimizer.step() was called 1 time(s) since "
                f"the last algo.step(), outside it: call algo.step() "
                f"in its place"
            ),
        ):
            algo.step()
        assert algo.steps == 0


def test_an_mpi_communicator_is_refused_with_the_communicator_to_pass():
    model = _net(seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for make in (
        lambda: create("wagma", model, optimizer, WORLD),
        lambda: ALGORITHMS["allreduce_sgd"](model, optimizer, WORLD),
    ):
        with pytest.raises(
            TypeError,
            match=re.escape("comm must be a collectives.Communicator, got the mpi4py communicator")
            + ".*"
            + re.escape("pass collectives.Communicator(comm), e.g. Communicator(MPI.COMM_WORLD)"),
        ):
            make()


def test_unknown_options_are_named_on_every_rank_with_the_accepted_ones(comm):
    model = _net(seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    last = WORLD.rank == P - 1
    with pytest.raises(
        ValueError,
        match=re.escape("local_sgd: rank")
        + ".*"
        + re.escape("tau: not an option of local_sgd; its options: period, reallocate, sync"),
    ):
        create("local_sgd", model, optimizer, comm, **({"tau": 4} if last else {"period": 4}))


def test_models_that_differ_name_the_first_parameter_that_does(comm):
    model = _net(seed=0)
    if P > 1 and WORLD.rank == P - 1:
        model[3].requires_grad_(False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if P == 1:
        create("local_sgd", model, optimizer, comm).close()
        return
    with pytest.raises(
        ValueError,
        match=re.escape(
            "local_sgd: the model's parameters differ across ranks; parameter 4 is rank 0: 3.weight (3, 16) float32;"
        )
        + ".*"
        + re.escape(f"rank {P - 1}: 3.weight (3, 16) float32 frozen"),
    ):
        create("local_sgd", model, optimizer, comm)


def test_an_optimizer_without_a_trainable_parameter_is_named(comm):
    model = _net(seed=0)
    optimizer = torch.optim.SGD(list(model.parameters())[:-1], lr=0.1)
    with pytest.raises(
        ValueError,
        match=re.escape("optimizer must own every trainable parameter of the model; it lacks 3.bias (1 in all)"),
    ):
        create("allreduce_sgd", model, optimizer, comm)


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_each_algorithm_says_what_a_gradient_holds_before_step(name):
    doc = " ".join(ALGORITHMS[name].__doc__.split())
    # The role names Algorithm.step, the method a subclass inherits: :meth:`~wagma.algorithms.base.Algorithm.step`.
    step = r":meth:`~?(wagma\.algorithms\.base\.Algorithm\.)?step`"
    assert re.search(rf"[Bb]etween ``backward\(\)`` and {step} the gradients|When ``backward\(\)`` returns", doc), doc
