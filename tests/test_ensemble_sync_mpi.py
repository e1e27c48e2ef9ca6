"""EnsembleSync under mpiexec: the members' average, a stopped rank and its rejoin, Lemma 1's shares, bad input.

The stop is real: the last rank sends itself SIGSTOP at the start of step
STOP_AT and a helper process continues it OUTAGE seconds later, twice the
timeout.
"""

import json
import os
import time

import numpy as np
import pytest
import torch
from mpi4py import MPI

from collectives import Communicator
from collectives.member_allreduce import member_allreduce
from experiments.train import EXIT_USAGE, main
from wagma.algorithm_options import auto_group_size
from wagma.algorithms import create
from wagma.ensemble_coordinator import ROUND_FIELDS, STATUS, Decision
from wagma.reallocation import lemma1_shares
from wagma.results import load_run

pytestmark = pytest.mark.mpi

WORLD = MPI.COMM_WORLD
P = WORLD.size


def _subsets():
    ranks = list(range(P))
    yield ranks
    yield ranks[::2]
    yield [P - 1, 0] if P > 1 else [0]
    yield [P - 1]
    yield list(reversed(ranks))


@pytest.mark.parametrize("members", list(_subsets()), ids=str)
def test_member_allreduce_sums_over_the_members_alone_bitwise_equal_everywhere(members):
    comm = WORLD.Dup()
    try:
        values = np.random.default_rng(WORLD.rank).standard_normal(1000)
        if WORLD.rank in members:
            total = member_allreduce(values.copy(), comm, members, tag=7)
            exact = sum(np.random.default_rng(r).standard_normal(1000) for r in sorted(members))
            np.testing.assert_allclose(total, exact, rtol=1e-12, atol=1e-12)    # reassociation only
            everyone = comm.allgather(total if WORLD.rank in members else None)
            for other in members:
                np.testing.assert_array_equal(everyone[other], total)           # the root's bytes
        else:
            comm.allgather(None)
    finally:
        comm.Free()


STOP_AT, PERIOD, TIMEOUT, OUTAGE, STEPS = 10, 5, 1.0, 2.0, 150


@pytest.mark.timing
@pytest.mark.mpi(min_size=2)
def test_the_others_do_not_wait_for_a_stopped_rank_which_rejoins_by_skipping_forward(shared_dir,
                                                                                      record_measurement):
    out = os.path.join(shared_dir, "ensemble-stop.h5")
    victim = P - 1
    rc = main(["--algo", "ensemble_sync", "--period", str(PERIOD), "--timeout-s", str(TIMEOUT),
               "--dataset", "digits", "--model", "mlp", "--epochs", "100", "--max-steps", str(STEPS),
               "--compute-ms", "15", "--eval-every", "0", "--out", out, "--no-progress",
               "--fault", f"stop:rank={victim},step={STOP_AT},seconds={OUTAGE}"])
    assert rc == 0
    WORLD.Barrier()
    if WORLD.rank:
        return
    run = load_run(out)
    assert run.attrs["status"] == "complete" and json.loads(run.attrs["dead_ranks"]) == []
    steps, rounds = run.steps, run.tables["rounds"]
    fields = {name: i for i, name in enumerate(ROUND_FIELDS)}
    status = rounds[:, len(ROUND_FIELDS) + victim]
    assert np.all(np.isfinite(steps["clock"]))             # every rank has a row for every step
    # The round the victim was stopped in closed at the timeout, without it.
    missed = int(np.flatnonzero(status == STATUS["late"])[0])
    assert rounds[missed, fields["end_step"]] == (STOP_AT // PERIOD + 1) * PERIOD
    assert rounds[missed, fields["timed_out"]] == 1
    # waited: from the round's first report to its close, the timeout plus the
    # coordinator's polling (2 ms) and its share of 2 cores (0.5 s of slack).
    record_measurement("waited beyond the timeout, s", rounds[missed, fields["waited"]] - TIMEOUT, 0.5)
    assert TIMEOUT <= rounds[missed, fields["waited"]] < TIMEOUT + 0.5
    # Later rounds while it was away did not wait for it at all: the others went on.
    away = np.flatnonzero(status == STATUS["late"])
    assert len(away) >= 2 and np.all(rounds[away[1:], fields["timed_out"]] == 0)
    # Its outage, on the training clock (common start): it ended its step
    # STOP_AT - 1, was stopped for OUTAGE seconds, then ran the rest of its round.
    stopped_from = steps["clock"][victim, STOP_AT - 1]
    others = [r for r in range(P) if r != victim]
    during = (steps["clock"][others] < stopped_from + OUTAGE) & (steps["skipped"][others] == 0)
    # They finished at least one whole round more than the one that timed out
    # while it was stopped: they did not wait for it.
    assert np.all(during.sum(axis=1) >= rounds[missed, fields["end_step"]] + PERIOD)
    # The rejoin: the victim reported late, joined the next round to close
    # with weight 0 and skipped the steps between its round and that one.
    joined = int(np.flatnonzero(status == STATUS["joiner"])[0])
    first, stop = int(rounds[missed, fields["end_step"]]), int(rounds[joined, fields["end_step"]])
    assert stop > first
    skipped = np.flatnonzero(steps["skipped"][victim])
    np.testing.assert_array_equal(skipped, np.arange(first, stop))
    assert np.all(steps["samples"][victim, first:stop] == 0)
    assert np.all(steps["skipped"][others] == 0)
    assert np.all(status[joined + 1:] == STATUS["member"])
    events = json.loads(run.attrs["fault_events"])
    assert events == [{"rank": victim, "kind": "late", "missed_round": missed, "missed_step": first,
                       "others_waited_s": pytest.approx(rounds[missed, fields["waited"]]),
                       "rejoined_round": joined, "rejoined_step": stop}]
    # No other round timed out: only the stopped rank was ever a timeout late
    # (with 15 ms steps and 5-step rounds the others stay within ~0.1 s).
    others_rounds = [i for i in range(len(rounds)) if i != missed]
    assert np.all(rounds[others_rounds, fields["timed_out"]] == 0)


def test_the_average_is_weighted_by_the_samples_each_member_processed():
    """A hand-made decision: members with weights 1, 2, ..., the last rank
    (when P > 2) not a member; every member must end with
    sum_j w_j x_j / sum_j w_j, where rank j's parameters are all j."""
    model = torch.nn.Linear(3, 2)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float(WORLD.rank))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    members = list(range(P - 1)) if P > 2 else list(range(P))
    weights = np.array([float(r + 1) if r in members else -1.0 for r in range(P)])
    decision = Decision(np.concatenate([[0, 1, 0], weights, np.ones(P)]), P)
    with Communicator(WORLD) as comm, create("ensemble_sync", model, optimizer, comm, period=1) as algo:
        if WORLD.rank in members:
            algo._average(decision)
            expected = sum((r + 1) * r for r in members) / sum(r + 1 for r in members)
            for p in model.parameters():
                torch.testing.assert_close(p, torch.full_like(p, expected), rtol=1e-6, atol=1e-6)
        else:
            for p in model.parameters():
                assert torch.all(p == WORLD.rank)     # not a member: untouched
        WORLD.Barrier()


@pytest.mark.timing
@pytest.mark.parametrize("algorithm", ["local_sgd", "wagma", "ensemble_sync"])
def test_reallocation_gives_each_rank_lemma_1s_share_of_the_global_batch(algorithm, record_measurement):
    """Injected speeds: rank r takes 3 (1 + r) ms per sample (a sleep of
    samples x that), so v_r = 1000 / (3 (1 + r)) samples/s and Lemma 1's
    shares are B v_r / sum v, B = P x 16.

    A rank's measured speed is its samples over the seconds of its steps in
    a period, and a sleep lasts longer than asked by the scheduler's delay
    (a few ms on 2 busy cores; at 1 ms per sample, 10-15 % of a period of
    about 100 ms, which moved a share by more than 10 %).  At 3 ms a period
    lasts about 300 ms, so those delays move a speed by a few percent."""
    batch, period, periods = 16, 3, 6
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    options = {"local_sgd": {"period": period},
               "wagma": {"tau": period, "group_size": auto_group_size(P), "wait_avoiding": False,
                         "group_averaging": False},
               "ensemble_sync": {"period": period, "timeout_s": 60.0}}[algorithm]
    per_sample = 3 * (1 + WORLD.rank) / 1e3
    shares = []
    with Communicator(WORLD) as comm, create(algorithm, model, optimizer, comm, reallocate=True,
                                               **options) as algo:
        algo.plan(period * periods, batch)
        for _ in range(period * periods):
            shares.append(algo.samples_per_step)
            time.sleep(algo.samples_per_step * per_sample)
            algo.zero_grad()
            algo.step()
    shares = np.array(WORLD.allgather(shares))          # [rank, step]
    assert np.all(shares.sum(axis=0) == P * batch)      # the global batch never changes
    assert np.all(shares[:, :period] == batch)          # nothing measured yet: the run's batch
    expected = lemma1_shares(P * batch, [1 / (1 + r) for r in range(P)])
    # After the first measured period the shares are Lemma 1's up to the
    # timing of sleeps on a shared machine: one sample, or 10 % of the share.
    # Whole samples: off <= allowed exactly when off - floor(allowed) < 1.
    allowed = np.floor(np.maximum(1, 0.1 * expected))[:, None]
    beyond = np.abs(shares[:, 2 * period:] - expected[:, None]) - allowed
    record_measurement("samples off Lemma 1's share beyond max(1, 10 % of it), rounded down", beyond.max(), 1)
    for step in range(2 * period, period * periods):
        assert np.all(np.abs(shares[:, step] - expected) <= np.maximum(1, 0.1 * expected)), (step, shares[:, step])


@pytest.mark.parametrize("argv, words", [
    (["--algo", "ensemble_sync", "--timeout-s", "0"], "--timeout-s must be a number of seconds above 0"),
    (["--algo", "ensemble_sync", "--period", "0"], "--period must be an int >= 1"),
    (["--algo", "ensemble_sync", "--fault", "stop:rank=0,step=2,seconds=1"], "rank 0 runs ensemble_sync's"),
    (["--algo", "ensemble_sync", "--fault", f"kill:rank={P},step=2"], "rank must be an integer in"),
    (["--algo", "ensemble_sync", "--fault", "kill:rank=0,step=99"], "steps must lie in [0, 9]"),
    # mpi-pytest starts no job with fault tolerance: a kill would end it.
    (["--algo", "ensemble_sync", "--fault", f"kill:rank={P - 1},step=2"], "survivors need MPI fault tolerance"),
    (["--algo", "adpsgd", "--reallocate"], "--reallocate is an option of ensemble_sync and local_sgd and wagma"),
])
def test_bad_ensemble_sync_input_fails_every_rank_before_training(shared_dir, argv, words, capsys):
    out = os.path.join(shared_dir, "bad-ensemble.h5")
    rc = main([*argv, "--dataset", "digits", "--model", "mlp", "--epochs", "1", "--max-steps", "10",
               "--out", out, "--no-progress"])
    assert rc == EXIT_USAGE
    if WORLD.rank == 0:
        assert words in capsys.readouterr().err
    assert not os.path.exists(out)

