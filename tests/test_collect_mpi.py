"""LaggedVote under mpiexec: every rank gets the same answer at the same step, without lock-stepping the ranks."""

import pytest
from mpi4py import MPI

from collectives.collect import LaggedVote

pytestmark = pytest.mark.mpi

WORLD = MPI.COMM_WORLD


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
