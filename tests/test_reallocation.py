"""Lemma 1 of EnsembleSync on synthetic speeds: equal times, the global batch kept, the floor, absent ranks."""

import itertools

import numpy as np
import pytest

from wagma.reallocation import Reallocation, lemma1_shares


@pytest.mark.parametrize("seed", range(20))
def test_shares_equalise_the_ranks_times_and_sum_to_the_global_batch(seed):
    rng = np.random.default_rng(seed)
    ranks = int(rng.integers(2, 65))
    speeds = rng.uniform(50, 5000, ranks)  # samples per second
    budget = int(rng.integers(100 * ranks, 256 * ranks))  # every ideal share >= 1: no floor lifts one
    shares = lemma1_shares(budget, speeds)
    assert shares.sum() == budget and shares.dtype == np.int64
    times = shares / speeds
    # Lemma 1: the optimum has t_i = t* = B / sum v for all i.  In whole
    # samples each rank gets at least floor(t* v_i), so t_i > t* - 1 / v_i;
    # and no rank could take one more sample and finish before the makespan
    # M (else moving a sample from the rank that sets M would lower it): the
    # whole-sample optimum, the integer form of the lemma's equal times.
    ideal = budget / speeds.sum()
    assert np.all(times > ideal - 1 / speeds)
    assert np.all((shares + 1) / speeds >= times.max() - 1e-12)


def test_no_other_whole_allocation_has_a_smaller_makespan():
    """Lemma 1's optimality, by brute force over every allocation of 12 samples to 3 ranks."""
    speeds = np.array([1.0, 2.0, 5.0])
    best = min(
        max(x / v for x, v in zip(alloc, speeds))
        for alloc in itertools.product(range(13), repeat=3)
        if sum(alloc) == 12 and min(alloc) >= 1
    )
    shares = lemma1_shares(12, speeds)
    assert max(shares / speeds) == pytest.approx(best)


def test_equal_speeds_give_equal_shares_and_absent_ranks_none():
    np.testing.assert_array_equal(lemma1_shares(64, [3.0] * 4), [16] * 4)
    np.testing.assert_array_equal(lemma1_shares(64, [3.0, 0.0, 3.0, 3.0]), [22, 0, 21, 21])
    # A rank so slow that its ideal share is below one sample keeps the floor.
    np.testing.assert_array_equal(lemma1_shares(10, [1000.0, 1.0]), [9, 1])


@pytest.mark.parametrize(
    "budget, speeds, words",
    [
        (0, [1.0], "global_batch must be an int >= 1"),
        (8, [1.0, -1.0], "speeds must be finite and >= 0"),
        (8, [np.nan, 1.0], "speeds must be finite and >= 0"),
        (8, [0.0, 0.0], "at least one rank must have a speed above 0"),
        (2, [1.0, 1.0, 1.0], "3 ranks with at least 1 samples each exceed the global batch 2"),
    ],
)
def test_bad_arguments_are_named(budget, speeds, words):
    with pytest.raises(ValueError, match=words):
        lemma1_shares(budget, speeds)


def test_the_policy_moves_work_from_a_slow_rank_and_gives_it_back():
    policy = Reallocation(ranks=4, batch_size=16)
    np.testing.assert_array_equal(policy.shares, [16] * 4)
    # Period 1: rank 1 takes twice as long for its 16 samples per step.
    shares = policy.update(samples=[160] * 4, seconds=[1.0, 2.0, 1.0, 1.0])
    assert shares.sum() == 64 and shares[1] < shares[0]
    np.testing.assert_array_equal(shares, lemma1_shares(64, [160, 80, 160, 160]))
    # Rank 2 is absent (late): its share goes to the others, it keeps its speed.
    shares = policy.update(samples=[160, 80, 0, 160], seconds=[1.0, 1.0, 0.0, 1.0], present=[True, True, False, True])
    assert shares[2] == 0 and shares.sum() == 64
    # Back, unmeasured: it gets its last known speed, 160 samples/s.
    shares = policy.update(samples=[0] * 4, seconds=[0.0] * 4)
    np.testing.assert_array_equal(shares, lemma1_shares(64, [160, 80, 160, 160]))
