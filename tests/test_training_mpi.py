"""Every algorithm trains a small model on real data (scikit-learn's digits), under mpiexec.

Each rank sees only the digits of the classes c with c mod P == rank (a
non-IID split), and the average of the replicas (the model decentralized
methods are evaluated on) is scored on all classes.  Every algorithm must
end below half its starting loss and, with more than one rank, below half
the loss of a control run in which the replicas never average (each learns
only its own classes): so the test fails when averaging is broken.
Measured on 2 / 4 / 8 ranks (start 2.33): control 0.97 / 2.27 / 2.42,
algorithms 0.05 to 0.74, the slowest D-PSGD on a ring of 8.
"""

import numpy as np
import pytest
import torch
from mpi4py import MPI
from sklearn.datasets import load_digits

from collectives import Communicator
from wagma.algorithms import create

pytestmark = pytest.mark.mpi

WORLD = MPI.COMM_WORLD
P = WORLD.size
# 300 steps, not 150: at 150 the 2-rank AD-PSGD run reached 0.33 on loaded
# cores (against a bound of 0.47); at 300, 0.06-0.08.
STEPS = 300
# AD-PSGD's guarantee (Lian et al., ICML 2018, Theorem 1) is for plain SGD
# with a small enough step, and bounds an expectation over the order in
# which pairs meet, which here the OS's scheduling sets.  So AD-PSGD trains
# without momentum: with momentum 0.9 (lr 0.1), the local momentum buffers
# that no exchange averages now and then pulled the replicas apart, and
# their average far from every class (its loss: median 0.14 and 5 of 400
# runs at 1.27-3.23 on 4 ranks of 2 cores, one replica 3-5x further from
# the average than the others), while plain SGD at lr 0.3 ends at
# 0.13-0.15 (60 runs) on 2 ranks, 0.18-0.30 (150) on 4 and 0.34-1.12 (60,
# median 0.39) on 8, where the ring of 8 mixes slowly and the meeting order
# still spreads the runs (sum of the replicas conserved to 2e-7 in every
# run: no exchange lost or corrupted a model).  The test bounds the mean of
# three runs, the estimate of that expectation.
DEFAULT_OPTIMIZER = {"lr": 0.1, "momentum": 0.9}
OPTIMIZER = {"adpsgd": {"lr": 0.3, "momentum": 0.0}}
RUNS = {"adpsgd": 3}


def _data():
    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target)
    mine = (y % P) == WORLD.rank
    return x, y, x[mine], y[mine]


def _options():
    levels = {2: 2, 6: P} if P % 2 == 0 and P > 2 else {2: P}
    yield "allreduce_sgd", {}
    yield "local_sgd", {"period": 2}
    yield "hierarchical_sgd", {"period_group_size_dict": levels}
    yield "dpsgd", {}
    yield "sgp", {"peers": 1}
    yield "ensemble_sync", {"period": 2, "timeout_s": 30.0}  # no rank is ever 30 s late here: local SGD
    yield "wagma", {"group_size": min(2, P), "tau": 4}
    # On 2 ranks a majority is one rank, so the other is often late: its
    # gradient is carried to the next version (it used to be re-sent to
    # every version it missed, which kept the loss at 1.78 in about half
    # of the runs).
    yield "eager_sgd", {"quorum": "majority"}
    yield "adpsgd", {}


# Trained at 2 and 4 ranks only: these average over every rank (eager-SGD
# over a majority of them) with the same collectives whatever the rank count,
# which test_schedules_mpi.py and test_wait_avoiding_mpi.py check exactly at
# 8 ranks too.  At 8 the test keeps the algorithms whose communication pattern
# changes with the rank count: D-PSGD's ring, hierarchical SGD's levels,
# WAGMA's butterfly groups, AD-PSGD's pairings and SGP's exponential graph.
SAME_PATTERN_AT_ANY_P = ("allreduce_sgd", "local_sgd", "ensemble_sync", "eager_sgd")


def _params():
    for name, options in _options():
        skip = pytest.mark.skipif(
            P > 4 and name in SAME_PATTERN_AT_ANY_P,
            reason=f"{name} averages over every rank the same way at any rank count: the 2- and "
            f"4-rank stages train it; at {P} ranks only the algorithms whose communication "
            f"pattern changes with the rank count",
        )
        yield pytest.param(name, options, id=name, marks=skip)


def _train(name, options):
    """Final and initial loss, on all classes, of the average of the replicas."""
    x, y, mine_x, mine_y = _data()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    loss_fn = torch.nn.functional.cross_entropy
    with torch.no_grad():
        start = loss_fn(model(x), y).item()
    g = torch.Generator().manual_seed(WORLD.rank)
    optimizer = torch.optim.SGD(model.parameters(), **OPTIMIZER.get(name, DEFAULT_OPTIMIZER))
    with Communicator(WORLD) as comm:
        with create(name, model, optimizer, comm, **options) as algo:
            for _ in range(STEPS):
                batch = torch.randint(0, len(mine_y), (32,), generator=g)
                algo.zero_grad()
                loss_fn(model(mine_x[batch]), mine_y[batch]).backward()
                algo.step()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.from_numpy(WORLD.allreduce(p.numpy(), op=MPI.SUM)) / P)
        return loss_fn(model(x), y).item(), start


@pytest.fixture(scope="module")
def control_loss():
    """The loss of the replicas' average when they never average."""
    final, _ = _train("local_sgd", {"period": 10 * STEPS})
    return final


@pytest.mark.timing  # the asynchronous algorithms' outcome depends on who arrives when
@pytest.mark.parametrize("name, options", list(_params()))
def test_trains_well_below_the_start_and_the_control(name, options, control_loss, record_measurement):
    finals, starts = zip(*(_train(name, options) for _ in range(RUNS.get(name, 1))))
    final, start = float(np.mean(finals)), starts[0]
    bound = min(0.5 * start, 0.5 * control_loss) if P > 1 else 0.5 * start
    for one in finals:
        record_measurement("final loss, one run", one, bound)
    record_measurement("final loss, tested", final, bound)
    assert final < 0.5 * start, f"{name}: loss {start:.3f} -> {final:.3f}"
    if P > 1:
        assert final < 0.5 * control_loss, (
            f"{name}: loss {final:.3f}, not clearly below {control_loss:.3f} without averaging"
        )
