"""DiLoCo, Streaming DiLoCo and the outer step of local SGD and WAGMA-SGD against a single-process reference.

Bit for bit on any rank count: every parameter stays in [0.5, 2) (checked
at every step), so each rank's pseudo-gradient, the anchor minus a
parameter within a factor of two of it, is exact (Sterbenz), and all
pseudo-gradients are multiples of 2**-24 whose sums stay far below
2**24 * 2**-24: the ranks' sum is exact in any order, whatever schedule
the allreduce runs, and the scaling by 1/P rounds the same exact sum on
every rank and in the reference.  The rest (the inner steps, the outer
SGD step, the merge) runs the same torch operations on tensors of the
same lengths in both.
"""

import copy

import pytest
import torch
from mpi4py import MPI

from collectives.comm import Communicator
from wagma.algorithms import create

WORLD = MPI.COMM_WORLD
P = WORLD.size
INNER_LR = 2.0**-3


@pytest.fixture
def comm():
    with Communicator(WORLD) as comm:
        yield comm


def _net():
    """Three layers (so up to three fragments), every parameter in [1.25, 1.75)."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 4), torch.nn.Linear(4, 3))
    with torch.no_grad():
        for p in net.parameters():
            p.uniform_(1.25, 1.75)
    return net


def _gradients(model, rank, t):
    """Rank ``rank``'s gradients at step ``t``: the same in every process."""
    g = torch.Generator().manual_seed(1000 * t + rank)
    return [torch.randint(-64, 65, p.shape, generator=g).float() * 2.0**-12 for p in model.parameters()]


def _inner(kind):
    if kind == "sgd":
        return lambda params: torch.optim.SGD(params, lr=INNER_LR)
    return lambda params: torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1)


class Reference:
    """DiLoCo (Douillard et al., 2023, Algorithm 1) and Streaming DiLoCo
    (2025) written out: P replicas in one process, each with its own inner
    optimizer; each fragment's anchor and momentum buffer; the ranks' average
    as the sum in rank order times 1/P; torch.optim.SGD's momentum rule in its
    own tensor operations and order (buf = m * buf + Delta; Nesterov's step
    Delta + m * buf; the anchor minus lr times the step)."""

    def __init__(self, model, inner, *, period, lr, momentum, nesterov=True, fragments=1, overlap=0, mixing=0.5):
        self.models = [copy.deepcopy(model) for _ in range(P)]
        self.optimizers = [inner(m.parameters()) for m in self.models]
        self.period, self.lr, self.momentum, self.nesterov = period, lr, momentum, nesterov
        self.overlap, self.mixing = overlap, mixing
        # Fragment f: the layers f, f + M, ... (the paper's strided fragments), each layer a
        # Linear's weight and bias; its exchanges after the steps t with (t + 1) % H = floor(f H / M).
        layers = len(list(model.children()))
        self.fragments = [[2 * i + k for i in range(f, layers, fragments) for k in (0, 1)] for f in range(fragments)]
        self.offsets = [f * period // fragments for f in range(fragments)]
        self.anchors = [self._values(0, f) for f in range(fragments)]
        self.buffers = [None] * fragments
        self.in_flight = []

    def _params(self, replica, fragment):
        params = list(self.models[replica].parameters())
        return [params[i] for i in self.fragments[fragment]]

    def _values(self, replica, fragment):
        return torch.cat([p.detach().reshape(-1) for p in self._params(replica, fragment)])

    def step(self, t):
        for rank, (model, optimizer) in enumerate(zip(self.models, self.optimizers)):
            for p, g in zip(model.parameters(), _gradients(model, rank, t)):
                p.grad = g
            optimizer.step()
        while self.in_flight and self.in_flight[0][0] == t:
            self._land(*self.in_flight.pop(0)[1:])
        for f, offset in enumerate(self.offsets):
            if (t + 1) % self.period == offset:
                total = self.anchors[f] - self._values(0, f)
                for rank in range(1, P):
                    total.add_(self.anchors[f] - self._values(rank, f))
                average = total.mul_(1.0 / P)
                if self.overlap == 0:
                    self._land(f, average)
                else:
                    self.in_flight.append((t + self.overlap, f, average))

    def _land(self, f, average):
        if self.momentum == 0:
            step = average
        else:
            if self.buffers[f] is None:
                self.buffers[f] = average.clone()
            else:
                self.buffers[f].mul_(self.momentum).add_(average)
            step = average.add(self.buffers[f], alpha=self.momentum) if self.nesterov else self.buffers[f]
        self.anchors[f].add_(step, alpha=-self.lr)
        with torch.no_grad():
            for rank in range(P):
                offset = 0
                for p in self._params(rank, f):
                    value = self.anchors[f][offset : offset + p.numel()].view(p.shape)
                    offset += p.numel()
                    p.copy_(value) if self.overlap == 0 else p.lerp_(value, 1.0 - self.mixing)

    def parameters(self, rank):
        return [p.detach() for p in self.models[rank].parameters()]


def _run(comm, name, reference, inner, steps, **options):
    model = _net()
    with create(name, model, inner(model.parameters()), comm, **options) as algo:
        for t in range(steps):
            for p, g in zip(model.parameters(), _gradients(model, comm.rank, t)):
                p.grad.copy_(g)
            algo.step()
            reference.step(t)
            mine, expected = [p.detach() for p in model.parameters()], reference.parameters(comm.rank)
            assert all(0.5 <= float(p.min()) and float(p.max()) < 2.0 for p in expected), "the exactness argument"
            differ = [i for i, (a, b) in enumerate(zip(mine, expected)) if not torch.equal(a, b)]
            assert not differ, f"step {t}: parameters {differ} differ from the reference on rank {comm.rank}"
        return algo


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("inner", ["sgd", "adamw"])
@pytest.mark.parametrize("sync", ["allreduce", "stragglar"])
def test_diloco_is_the_reference_bit_for_bit(comm, inner, sync):
    reference = Reference(_net(), _inner(inner), period=3, lr=0.7, momentum=0.9)
    algo = _run(comm, "diloco", reference, _inner(inner), 13, period=3, sync=sync)
    assert torch.equal(algo.outer.anchors[0], reference.anchors[0])


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize(
    "fragments, overlap, mixing, nesterov",
    [(1, 0, 0.5, True), (2, 1, 0.5, True), (3, 2, 0.25, False), (3, 0, 0.5, True), (2, 3, 0.0, True)],
)
def test_streaming_diloco_is_the_reference_bit_for_bit(comm, fragments, overlap, mixing, nesterov):
    options = dict(period=4, fragments=fragments, overlap_steps=overlap, mixing=mixing, outer_nesterov=nesterov)
    reference = Reference(
        _net(),
        _inner("adamw"),
        period=4,
        lr=0.7,
        momentum=0.9,
        nesterov=nesterov,
        fragments=fragments,
        overlap=overlap,
        mixing=mixing,
    )
    algo = _run(comm, "streaming_diloco", reference, _inner("adamw"), 15, **options)
    for outer, anchor in zip(algo.outers, reference.anchors):
        assert torch.equal(outer.anchors[0], anchor)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize(
    "name, options",
    [
        ("local_sgd", dict(period=3)),
        ("wagma", dict(tau=3, wait_avoiding=False, group_averaging=False)),
    ],
)
def test_the_outer_optimizer_of_local_sgd_and_wagma_is_dilocos(comm, name, options):
    # Local SGD, and WAGMA-SGD with no groups between its global averages, with an outer
    # optimizer are DiLoCo with the same H and outer step: the reference's, bit for bit.
    reference = Reference(_net(), _inner("sgd"), period=3, lr=0.5, momentum=0.8, nesterov=False)
    _run(comm, name, reference, _inner("sgd"), 10, outer_lr=0.5, outer_momentum=0.8, outer_nesterov=False, **options)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("switch", ["wait_avoiding", "group_averaging"])
def test_wagmas_global_average_with_an_outer_optimizer_is_the_outer_step_of_every_ranks_model(comm, switch):
    # Between global averages the groups average (with wait_avoiding, in an order the timing
    # decides); at a global average every rank's W'_t, known here from the model before the
    # step and the inner SGD step, gives the reference's outer step, which every rank must take.
    model = _net()
    reference = Reference(_net(), _inner("sgd"), period=3, lr=0.7, momentum=0.9)
    options = {"wait_avoiding": switch == "wait_avoiding", "group_averaging": switch == "group_averaging"}
    with create(
        "wagma", model, _inner("sgd")(model.parameters()), comm, tau=3, outer_lr=0.7, outer_momentum=0.9, **options
    ) as algo:
        for t in range(9):
            before = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
            gradients = _gradients(model, comm.rank, t)
            for p, g in zip(model.parameters(), gradients):
                p.grad.copy_(g)
            algo.step()
            if (t + 1) % 3:
                continue
            inner = before.add(torch.cat([g.reshape(-1) for g in gradients]), alpha=-INNER_LR)
            models = comm.control.allgather(inner)
            total = reference.anchors[0] - models[0]
            for other in models[1:]:
                total.add_(reference.anchors[0] - other)
            reference._land(0, total.mul_(1.0 / P))
            after = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
            assert 0.5 <= float(inner.min()) and float(inner.max()) < 2.0, "the exactness argument"
            assert torch.equal(after, reference.anchors[0]), f"step {t}, rank {comm.rank}"
            assert torch.equal(algo.outer.anchors[0], reference.anchors[0])


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("name", ["diloco", "streaming_diloco"])
def test_a_resumed_run_goes_on_with_the_outer_state(comm, name):
    # Stopped after 6 steps (Streaming DiLoCo with an exchange in flight) and resumed from
    # the model, the inner optimizer and the algorithm's state_dict: the same run.
    options = dict(period=4, **({"fragments": 2, "overlap_steps": 2} if name == "streaming_diloco" else {}))

    def train(steps, start=0, state=None):
        model = _net()
        optimizer = _inner("adamw")(model.parameters())
        with create(name, model, optimizer, comm, **options) as algo:
            if state is not None:
                model.load_state_dict(state["model"])
                optimizer.load_state_dict(state["optimizer"])
                algo.load_state_dict(state["algorithm"])
            for t in range(start, steps):
                for p, g in zip(model.parameters(), _gradients(model, comm.rank, t)):
                    p.grad.copy_(g)
                algo.step()
            return model, {
                "model": copy.deepcopy(model.state_dict()),
                "optimizer": copy.deepcopy(optimizer.state_dict()),
                "algorithm": copy.deepcopy(algo.state_dict()),
            }

    whole, _ = train(12)
    _, state = train(6)
    resumed, _ = train(12, start=6, state=state)
    assert all(torch.equal(a, b) for a, b in zip(whole.parameters(), resumed.parameters()))


@pytest.mark.mpi(min_size=2)
def test_more_fragments_than_layers_is_refused_on_every_rank_before_any_message(comm):
    model = _net()
    with pytest.raises(ValueError, match=r"fragments must be at most the model's 3 layers .*got 4"):
        create("streaming_diloco", model, _inner("sgd")(model.parameters()), comm, period=8, fragments=4)
