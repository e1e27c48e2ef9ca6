"""Imbalance models: parsing, the distributions they draw, and reproducibility from the seed."""

import numpy as np
import pytest

from wagma.imbalance import parse_imbalance


def test_random_k_delays_exactly_k_distinct_ranks_each_step_and_spreads_them():
    model = parse_imbalance("random:k=2,ms=320", ranks=8, seed=3)
    table = model.table(2000)
    assert model.kind == "delay" and table.shape == (2000, 8)
    assert set(np.unique(table)) == {0.0, 0.32}
    assert np.all((table > 0).sum(axis=1) == 2)
    # Uniform choice: every rank is late in about a quarter of the steps.
    share = (table > 0).mean(axis=0)
    assert np.all(np.abs(share - 0.25) < 0.04), share


def test_draws_reproduce_from_the_seed_in_any_order_and_differ_across_seeds():
    a = parse_imbalance("random:k=2,ms=320", 8, seed=1)
    b = parse_imbalance("random:k=2,ms=320", 8, seed=1)
    assert np.array_equal(a.table(50), np.stack([b.seconds(t) for t in range(50)]))
    assert np.array_equal(a.seconds(37), b.table(10, first=30)[7])  # random access: resume
    c = parse_imbalance("random:k=2,ms=320", 8, seed=2)
    assert not np.array_equal(a.table(50), c.table(50))


def test_a_switching_straggler_keeps_its_rank_for_a_block_of_steps():
    late = parse_imbalance("switching:every=7,ms=50", 8, seed=1).table(70)
    assert np.all((late > 0).sum(axis=1) == 1) and np.all(late.max(axis=1) == 0.05)
    ranks = late.argmax(axis=1)
    assert all(len(set(ranks[b : b + 7])) == 1 for b in range(0, 70, 7))
    assert len(set(ranks)) > 2  # 10 blocks, 8 ranks: several draws
    again = parse_imbalance("switching:every=7,ms=50", 8, seed=1)
    assert np.array_equal(again.seconds(40), late[40])  # any step alone, as a resumed run asks


def test_bernoulli_straggler_and_distributions():
    stalls = parse_imbalance("bernoulli:p=0.01,ms=1000", 16, seed=0).table(5000)
    assert set(np.unique(stalls)) == {0.0, 1.0}
    assert 0.007 < (stalls > 0).mean() < 0.013
    late = parse_imbalance("straggler:rank=3,ms=100", 4).table(10)
    assert np.all(late[:, 3] == 0.1) and np.all(np.delete(late, 3, axis=1) == 0)
    rl = parse_imbalance("lognormal:median_ms=2000,sigma=1,min_ms=1700,max_ms=43500", 64)
    times = rl.table(200)
    assert rl.kind == "compute"
    assert times.min() >= 1.7 and times.max() <= 43.5
    assert 1.9 < np.median(times) < 2.5  # the clip at 1.7 s lifts the median a little
    uniform = parse_imbalance("uniform:min_ms=10,max_ms=40", 4).table(1000)
    assert 0.010 <= uniform.min() and uniform.max() <= 0.040 and abs(uniform.mean() - 0.025) < 0.002
    assert not parse_imbalance("none", 4).table(5).any()


def test_trace_files_replay_2d_and_sample_1d(tmp_path):
    replay = tmp_path / "trace.csv"
    replay.write_text("10,20\n30,40\n50,60\n")
    table = parse_imbalance(f"trace:{replay}", ranks=4).table(4)
    assert np.allclose(table * 1e3, [[10, 20, 10, 20], [30, 40, 30, 40], [50, 60, 50, 60], [10, 20, 10, 20]])
    pool = tmp_path / "pool.npy"
    np.save(pool, np.array([5.0, 7.0]))
    drawn = parse_imbalance(f"trace:{pool}", ranks=8, seed=4).table(100)
    assert set(np.round(np.unique(drawn) * 1e3, 6)) == {5.0, 7.0}


@pytest.mark.parametrize(
    "spec, words",
    [
        ("random:k=9,ms=320", "k must be an integer in [0, 8]"),
        ("random:k=2", "missing ms"),
        ("random:k=2,ms=320,x=1", "unknown x"),
        ("bernoulli:p=1.5,ms=10", "p must be in [0, 1]"),
        ("straggler:rank=8,ms=10", "rank must be an integer in [0, 7]"),
        ("uniform:min_ms=5,max_ms=1", "min_ms must be <= max_ms"),
        ("switching:every=0,ms=10", "every must be an integer >= 1"),
        ("switching:ms=10", "missing every"),
        ("trace:/no/such/file", "does not exist"),
        ("gauss:ms=3", "unknown form 'gauss'"),
        ("random:k=two,ms=3", "k must be a number"),
    ],
)
def test_bad_specs_name_the_option_and_the_accepted_forms(spec, words):
    with pytest.raises(ValueError) as info:
        parse_imbalance(spec, ranks=8)
    assert "--imbalance" in str(info.value) and words in str(info.value)
    assert "random:k=K,ms=MS" in str(info.value)
