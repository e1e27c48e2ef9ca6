"""Accuracy claims over seeds (experiments.reproduce.seed_spread, accuracy_claims): each
variant's mean and spread from real run files, and a gap that counts only beyond the spread."""

import dataclasses

import numpy as np
import pytest

from experiments.reproduce.accuracy_claims import ACCURACY_SEEDS, EXTRA_SEEDS, SPREAD_TARGET, _order_row, _seeded
from experiments.reproduce.record import DIFFERS, IN_KIND, REPRODUCED
from experiments.reproduce.runs import ratio_verdict
from experiments.reproduce.seed_spread import SeedSpread, gap_counts, spread_of
from wagma.results import STEP_FIELDS, load_run, write_run


def run_file(path, accuracies, epochs):
    """A run file of 2 ranks and 4 steps whose evaluations have ``accuracies`` at ``epochs``."""
    steps = {name: np.ones((2, 4)) for name in STEP_FIELDS}
    steps["clock"] = np.cumsum(steps["step_time"], axis=1)
    steps["stale"] = np.array([[0, 1, 0, 1], [0, 0, 0, 0]], dtype=float)
    evals = {
        "step": np.arange(1, len(epochs) + 1),
        "epoch": np.asarray(epochs, float),
        "clock": np.arange(1, len(epochs) + 1, dtype=float),
        "accuracy": np.asarray(accuracies, float),
        "loss": np.ones(len(epochs)),
    }
    write_run(
        str(path),
        {"schema": "wagma-run/1", "kind": "measured", "algorithm": "wagma", "ranks": 2, "batch_size": 4},
        steps,
        evals,
    )
    return load_run(str(path))


def test_a_variant_s_spread_is_over_its_seeds_last_epoch_evaluations(tmp_path):
    epochs = [0.5, 1.0, 1.5, 2.0]
    runs = {
        0: run_file(tmp_path / "a.h5", [0.5, 0.6, 0.80, 0.84], epochs),
        1: run_file(tmp_path / "b.h5", [0.5, 0.6, 0.78, 0.90], epochs),
        2: run_file(tmp_path / "c.h5", [0.5, 0.6, 0.82, 0.82], epochs),
    }
    s = spread_of(runs)
    # The last epoch's evaluations are those at 1.5 and 2.0: means 82, 84 and 82 %.
    assert s.last_epoch == pytest.approx((82.0, 84.0, 82.0)) and s.final == pytest.approx((84.0, 90.0, 82.0))
    assert s.mean == pytest.approx(82 + 2 / 3) and s.spread == pytest.approx(2.0)
    assert s.final_spread == pytest.approx(8.0) and s.stale == pytest.approx(0.25)
    assert s.text() == "82.7 +- 1.0 (final 85.3 +- 4.0; 3 seeds)"


def spread(*last_epoch):
    return SeedSpread(tuple(range(len(last_epoch))), last_epoch, last_epoch, 0.0)


def test_a_gap_counts_only_beyond_the_larger_spread():
    assert gap_counts(spread(80, 81, 82), spread(76, 77, 78)) == (4.0, 2.0, True)
    assert gap_counts(spread(80, 81, 82), spread(74, 78, 82)) == (3.0, 8.0, False)


@pytest.mark.parametrize(
    "a, b, direction, verdict",
    [
        ((70, 71, 72), (80, 81, 82), "lower", IN_KIND),  # 10 points below, spreads of 2
        ((79, 80, 81), (80, 81, 82), "lower", DIFFERS),  # 1 point below: within the spread, not ordered
        ((85, 86, 87), (80, 81, 82), "lower", DIFFERS),  # above
        ((79, 80, 81), (80, 81, 82), "not lower", IN_KIND),  # below, but within the spread
        ((70, 71, 72), (80, 81, 82), "not lower", DIFFERS),
        ((81, 82, 83), (80, 81, 82), "not higher", IN_KIND),
        ((80, 81, 82), (80.5, 81.5, 82.5), "equal", IN_KIND),
        ((70, 71, 72), (80, 81, 82), "equal", DIFFERS),
    ],
)
def test_an_ordering_row_holds_as_the_gap_and_the_spread_say(a, b, direction, verdict):
    row = _order_row("claim", "paper", spread(*a), spread(*b), direction, "stale note")
    assert row.verdict == verdict
    assert row.ours == pytest.approx(np.mean(a) - np.mean(b))
    assert ("stale note" in row.why) == (verdict == DIFFERS)


def test_a_variant_with_a_wide_spread_gets_more_seeds(tmp_path):
    final = {"steady": [0.80, 0.81, 0.82], "wide": [0.70, 0.80, 0.90, 0.75, 0.85]}
    asked = []

    def run_one(key, seed):
        asked.append((key, seed))
        return run_file(tmp_path / f"{key}{seed}.h5", [final[key][seed]], [1.0])

    runs = _seeded(run_one, ["steady", "wide"])
    assert sorted(runs["steady"]) == list(ACCURACY_SEEDS)
    assert sorted(runs["wide"]) == [*ACCURACY_SEEDS, *EXTRA_SEEDS]  # a spread of 20 points
    assert (
        spread_of(runs["steady"]).spread
        <= SPREAD_TARGET
        < spread_of({s: runs["wide"][s] for s in ACCURACY_SEEDS}).spread
    )
    assert len(asked) == len(set(asked)) == 3 + 5  # no run twice


def test_a_seed_that_learned_and_lost_it_counts_as_diverged(tmp_path):
    epochs = [0.5, 1.0, 1.5, 2.0]
    runs = {
        0: run_file(tmp_path / "a.h5", [0.4, 0.78, 0.30, 0.10], epochs),  # best 78 %, last epoch 20 %
        1: run_file(tmp_path / "b.h5", [0.4, 0.60, 0.31, 0.31], epochs),  # 31 % of a best 60 %: above half
        2: run_file(tmp_path / "c.h5", [0.4, 0.80, 0.82, 0.84], epochs),
    }
    s = spread_of(runs, "D-PSGD")
    assert s.best == pytest.approx((78.0, 60.0, 84.0)) and s.diverged == 1 and s.label == "D-PSGD"


def test_a_row_with_a_diverged_variant_differs_and_says_so():
    trained = SeedSpread((0, 1, 2), (92, 92, 93), (92, 92, 93), 0.0, (93, 93, 93), "WAGMA-SGD")
    diverged = SeedSpread((0, 1, 2), (10, 10, 11), (10, 10, 11), 0.0, (78, 75, 80), "D-PSGD")
    row = _order_row("claim", "paper", diverged, trained, "lower", None)
    # 82 points below, far beyond the spreads: it would hold but for the divergence.
    assert row.verdict == DIFFERS and "D-PSGD diverged on 3 of 3 seeds" in row.why
    row = _order_row("claim", "paper", dataclasses.replace(diverged, best=(12, 11, 12)), trained, "lower", None)
    assert row.verdict == IN_KIND and "diverged" not in row.why  # never learned: not a divergence


@pytest.mark.parametrize(
    "ours, paper, noise, verdict",
    [
        (1.30, 1.24, 0.015, REPRODUCED),  # within 10 % of the paper's
        (1.60, 1.24, 0.015, IN_KIND),  # the paper's direction, beyond the noise
        (1.001, 1.24, 0.015, DIFFERS),  # above 1 by less than the times' spread: no direction
        (1.02, 1.13, 0.021, DIFFERS),  # within 10 % of the paper's, but within the spread of 1 too
        (1.001, 1.24, 0.0, IN_KIND),  # no spread measured: the direction alone decides
        (0.95, 1.24, 0.0, DIFFERS),
    ],
)
def test_a_time_ratio_within_its_spread_of_one_has_no_direction(ours, paper, noise, verdict):
    assert ratio_verdict(ours, paper, "note", noise)[0] == verdict
