"""RootCollector and LaggedVote under mpiexec: records reach the root without lock-stepping the ranks."""

import numpy as np
import pytest
from mpi4py import MPI

from collectives.collect import LaggedVote, RootCollector

pytestmark = pytest.mark.mpi

WORLD = MPI.COMM_WORLD


def test_every_rank_s_rows_reach_the_root_in_order():
    collector = RootCollector(WORLD, width=3)
    got = []
    rng = np.random.default_rng(WORLD.rank)
    for block in range(40):
        n = int(rng.integers(0, 4))
        collector.post([[WORLD.rank, block, i] for i in range(n)])
        if collector.is_root:
            got += collector.poll()
    got += collector.finish()
    collector.close()
    if WORLD.rank != 0:
        assert got == []
        return
    for rank in range(WORLD.size):
        rows = np.concatenate([r for src, r in got if src == rank] or [np.zeros((0, 3))])
        assert np.all(rows[:, 0] == rank)
        expected = []
        rank_rng = np.random.default_rng(rank)
        for block in range(40):
            expected += [[rank, block, i] for i in range(int(rank_rng.integers(0, 4)))]
        assert rows.tolist() == expected


def test_posting_does_not_wait_for_the_root():
    """Rank 0 does not poll until the others have posted 200 blocks each."""
    collector = RootCollector(WORLD, width=1)
    if WORLD.rank:
        for i in range(200):
            collector.post([[i]])
    WORLD.Barrier()  # reached by the senders only after all their posts returned
    got = collector.finish()
    collector.close()
    if WORLD.rank == 0:
        assert sum(len(rows) for _, rows in got) == 200 * (WORLD.size - 1)


def test_lagged_vote_answers_every_rank_at_the_same_step():
    vote = LaggedVote(WORLD, period=5)
    answers = []
    for step in range(1, 41):
        flag = WORLD.rank == WORLD.size - 1 and step >= 12  # one rank, from step 12 on
        answers.append(vote.vote(step, flag))
    vote.close()
    # Asked at step 15 (the first multiple of 5 with the flag up), answered at 20
    # and at every answer after it.
    fired = [step for step, a in zip(range(1, 41), answers) if a]
    assert fired == [20, 25, 30, 35, 40]
    assert WORLD.allgather(fired) == [fired] * WORLD.size
