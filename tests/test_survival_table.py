"""The survival campaign's table (experiments/survival.py), read from the committed run files of results/survival/.

The time to go on is measured from the victim's last step to the
survivors' next completed one, so it holds the survivors' own recovery
(revoke, shrink, agreement, rebuild: the membership row's ``recovery_s``);
a run without a membership change (ensemble_sync's non-zero victims) gives
the longest step a survivor took after the death.
"""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from experiments.survival import recovery_seconds, tabulate_survival
from wagma.results import load_run

RESULTS = Path(__file__).resolve().parent.parent / "results" / "survival"
FILES = ("sgp_none", "sgp_kill_0", "sgp_kill0_0", "ensemble_sync_none", "ensemble_sync_kill_0")


@pytest.fixture
def folder(tmp_path):
    for name in FILES:
        shutil.copy(RESULTS / f"{name}.h5", tmp_path)
    return tmp_path


def test_going_on_holds_the_survivors_own_recovery():
    run = load_run(str(RESULTS / "sgp_kill_0.h5"))
    (kill,) = json.loads(run.attrs["faults"])
    victim = kill["rank"]
    (change,) = np.flatnonzero(run.membership["left"] == victim)
    # The survivors' recovery is part of the time from the death to their next step.
    assert recovery_seconds(run, victim) >= run.membership["recovery_s"][change] > 0


def test_without_a_membership_change_the_longest_step_after_the_death_counts():
    run = load_run(str(RESULTS / "ensemble_sync_kill_0.h5"))
    (kill,) = json.loads(run.attrs["faults"])
    assert kill["rank"] not in run.membership.get("left", ())  # the coordinator leaves it out, no shrink
    clock = run.steps["clock"]
    survivors = [r for r in range(clock.shape[0]) if r != kill["rank"]]
    longest = np.nanmax(np.diff(clock[survivors], axis=1))
    assert 0 < recovery_seconds(run, kill["rank"]) <= longest


def test_the_table_is_read_from_the_files_and_keeps_other_algorithms_rows(folder):
    (sgp_kill, sgp_kill0) = tabulate_survival(str(folder), ["sgp"])
    assert (sgp_kill["victim"], sgp_kill["runs"], sgp_kill["how"]) == ("a rank", 1, "sigkill")
    assert sgp_kill0["victim"] == "rank 0"
    run = load_run(str(folder / "sgp_kill_0.h5"))
    victim = json.loads(run.attrs["faults"])[0]["rank"]
    assert sgp_kill["median_s"] == sgp_kill["max_s"] == recovery_seconds(run, victim)
    (ensemble,) = tabulate_survival(str(folder), ["ensemble_sync"])  # no rank-0 run copied: one row
    table = (folder / "table.md").read_text()
    assert "| sgp | 8 | a rank |" in table and "| ensemble_sync | 8 | a rank |" in table
    assert table.index("| sgp |") < table.index("| ensemble_sync |")  # the campaign's order
    assert ensemble["free"] == pytest.approx(
        float(load_run(str(folder / "ensemble_sync_none.h5")).eval["accuracy"][-1])
    )
