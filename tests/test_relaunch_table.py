"""The relaunch campaign's table (experiments/relaunch.py), read from the committed run files of results/relaunch/.

The time lost per failure without fault tolerance is the training done
again since the checkpoint plus the relaunch; both are read from the run
files (the completed run's membership row and the failed segment's file),
so they are checked here against the rows themselves.
"""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from experiments.relaunch import lost_seconds, tabulate_relaunch
from wagma.results import NOTICED, load_run

RESULTS = Path(__file__).resolve().parent.parent / "results" / "relaunch"


def test_the_time_lost_is_the_training_redone_since_the_checkpoint_and_the_relaunch():
    run = load_run(str(RESULTS / "sgp_kill_1.h5"))
    failed = load_run(str(RESULTS / "sgp_kill_1.failed-1.h5"))
    (kill,) = json.loads(run.attrs["faults"])
    victim = kill["rank"]
    (change,) = np.flatnonzero(run.membership["noticed"] == NOTICED["relaunch"])
    assert run.membership["left"][change] == victim
    checkpoint = int(run.membership["step"][change])
    assert checkpoint <= kill["first"]  # the relaunch went on from a checkpoint before the death
    redone, relaunch = lost_seconds(run, failed)
    # The victim's clock ran on from the checkpoint to its last step before it died.
    assert redone == pytest.approx(failed.steps["clock"][victim, kill["first"] - 1] - run.membership["clock"][change])
    assert redone >= 0 and relaunch == run.membership["recovery_s"][change] > 0
    # The relaunch's steps after the checkpoint replaced the failed segment's.
    assert np.isnan(run.steps["clock"][victim, checkpoint:]).all()
    assert np.isfinite(failed.steps["clock"][victim, :checkpoint]).all()


def test_the_table_is_read_from_the_files_and_keeps_other_algorithms_rows(tmp_path):
    for path in RESULTS.glob("sgp_*.h5"):
        shutil.copy(path, tmp_path)
    shutil.copy(RESULTS / "jobs.json", tmp_path)
    shutil.copy(RESULTS / "rows.json", tmp_path)
    (row,) = tabulate_relaunch(str(tmp_path), ["sgp"])
    kept = json.loads((RESULTS / "rows.json").read_text())
    assert row == next(r for r in kept if r["algorithm"] == "sgp")
    table = (tmp_path / "table.md").read_text()
    assert table == (RESULTS / "table.md").read_text()  # the other algorithms' rows come from rows.json
