"""The emulator replays what real ranks did: every emulated algorithm trains in a loop of
one's own on 2, 4 or 8 ranks (or any other number), its steps recorded in a run file
(:class:`wagma.step_recorder.StepRecorder`, the contributions included); rank 0
replays the file's schedule on P replicas in one process and gets every
rank's final model bitwise.

Each step one rank, a different one each time, sleeps before its forward
pass, so WAGMA-SGD's and eager-SGD's partial collectives begin without it:
the replay must take exactly the contributions the file says were taken,
and AD-PSGD's exchanges land between the steps the file says they did.
Sums add in the butterfly schedules' order, which the collectives use (the
ranks above the largest power of two folded into the others), and the
allreduce of small buffers adds in the same tree, recursive doubling; the
models have BatchNorm, whose statistics stay each rank's (Allreduce-SGD:
rank 0's, broadcast).
"""

import time

import pytest
import torch
from mpi4py import MPI

from collectives import Communicator
from collectives.gossip import active_ranks
from wagma.algorithms import create
from wagma.emulate import Emulator, logged_schedule
from wagma.results import load_run
from wagma.step_recorder import StepRecorder

pytestmark = pytest.mark.mpi
WORLD = MPI.COMM_WORLD
P = WORLD.size
STEPS, BATCH, SLEEP_S = 14, 8, 0.02

CASES = {
    "wagma": ("wagma", {"tau": 5}),
    "eager_majority": ("eager_sgd", {}),
    "eager_solo_newest": ("eager_sgd", {"quorum": "solo", "late": "newest", "limiter": 4}),
    "eager_half_accumulate": ("eager_sgd", {"quorum": "half", "late": "accumulate"}),
    "local_sgd": ("local_sgd", {"period": 3}),
    "dpsgd": ("dpsgd", {}),
    "sgp": ("sgp", {"peers": 1}),
    "allreduce_sgd": ("allreduce_sgd", {}),
    "adpsgd": ("adpsgd", {}),
}
PARTIAL = ("wagma", "eager_sgd")
#: The algorithms whose arithmetic depends on the order of events: the partial collectives and
#: AD-PSGD's asynchronous exchanges.
ORDERED = (*PARTIAL, "adpsgd")
#: Above this many ranks only the partial collectives run: their order is the replay's question
#: and it grows with P; the synchronous algorithms' arithmetic does not depend on the times, and
#: their rules are the same code at 2 and 4 ranks.
SYNCHRONOUS_UP_TO = 4


def _net():
    torch.manual_seed(7)
    return torch.nn.Sequential(
        torch.nn.Linear(10, 16), torch.nn.BatchNorm1d(16), torch.nn.Tanh(), torch.nn.Linear(16, 3)
    )


def _data(rank):
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(STEPS, BATCH, 10, generator=g), torch.randint(0, 3, (STEPS, BATCH), generator=g)


def _gradient(model, x, y):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    return loss.item()


def _optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)


@pytest.mark.timing  # that a partial collective began without the late rank: scheduling decides
@pytest.mark.parametrize("case", list(CASES))
def test_a_replayed_run_gives_every_rank_s_model_bitwise(case, shared_dir):
    name, options = CASES[case]
    if name not in ORDERED and P > SYNCHRONOUS_UP_TO:
        pytest.skip(f"{name} is synchronous: replayed at {SYNCHRONOUS_UP_TO} ranks and fewer")
    path = f"{shared_dir}/{case}.h5"
    model = _net()
    x, y = _data(WORLD.rank)
    with Communicator(WORLD) as comm:
        algo = create(name, model, _optimizer(model), comm, **options)
        with StepRecorder(algo, path, batch_size=BATCH, steps_planned=STEPS) as recorder:
            for t in range(STEPS):
                recorder.start_step()
                algo.zero_grad()
                if t % P == WORLD.rank:
                    time.sleep(SLEEP_S)
                loss = _gradient(model, x[t], y[t])
                recorder.compute_done()
                algo.step()
                recorder.end_step(t, loss)
            algo.close()  # before the recorder: AD-PSGD's exchanges are complete only then
    states = WORLD.gather({k: v.clone() for k, v in model.state_dict().items()})
    if WORLD.rank == 0:
        run = load_run(path)
        schedule = logged_schedule(run)
        replicas = [_net() for _ in range(P)]
        emulator = Emulator(schedule, replicas, [_optimizer(m) for m in replicas])
        data = [_data(r) for r in range(P)]
        emulator.run(lambda r, t: _gradient(replicas[r], data[r][0][t], data[r][1][t]))
        for r, (replica, state) in enumerate(zip(replicas, states)):
            mine = replica.state_dict()
            assert all(torch.equal(mine[k], state[k]) for k in state), (
                f"rank {r}: largest difference "
                f"{max(float((mine[k].double() - state[k].double()).abs().max()) for k in state):.3g}"
            )
        if name in PARTIAL and P > 1:
            assert run.steps["stale"].any(), "no contribution was stale: the replay did not test the order"
        if name == "adpsgd" and P > 1:
            exchanges = run.tables["exchanges"]
            assert len(exchanges) == 2 * len(active_ranks(P)) * STEPS, "each active rank's STEPS exchanges, both sides"
            assert (exchanges[:, 3] < exchanges[:, 4]).any(), (
                "no active rank added its difference after a later update than it copied at: "
                "the replay did not test the order"
            )
