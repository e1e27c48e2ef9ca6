"""The chaos campaign's committed record (experiments/chaos_campaign.py), read from the run files of results/chaos/.

The table must be what the committed run files give, every death the
membership records must be a failure of the table, struck by the plan,
and with spares left every row a failure emptied must be taken again, so
that a healed run ends on all its ranks.
"""

import shutil
from pathlib import Path

import numpy as np
import pytest

from experiments.chaos_campaign import ALGORITHMS, WAYS, failure_times, tabulate_chaos
from wagma.results import NOTICED, load_run

RESULTS = Path(__file__).resolve().parent.parent / "results" / "chaos"
HEALED = [a for a in ALGORITHMS if (RESULTS / f"{a}_healed.h5").exists()]


def _status(path):
    return int(Path(f"{path}.status").read_text())


def test_the_committed_table_is_what_the_run_files_give(tmp_path):
    for algo in ALGORITHMS:
        for way in WAYS:
            for suffix in (".h5", ".h5.status"):
                if (RESULTS / f"{algo}_{way}{suffix}").exists():
                    shutil.copy(RESULTS / f"{algo}_{way}{suffix}", tmp_path)
    tabulate_chaos(str(tmp_path), ALGORITHMS)
    assert (tmp_path / "table.md").read_text() == (RESULTS / "table.md").read_text()


@pytest.mark.parametrize("way", ["chaos", "healed"])
def test_every_death_in_a_run_file_is_matched_to_a_strike_of_its_plan(way):
    """Each row the membership records as gone is a failure of the table:
    one the chaos plan struck on that row, before the survivors noticed;
    the survivors' next step, where there is one, comes after it (a stop or
    a hang counts from the strike)."""
    for algo in ALGORITHMS:
        path = RESULTS / f"{algo}_{way}.h5"
        if not path.exists():
            continue
        run = load_run(str(path))
        m = run.membership
        deaths = int(np.sum((m["noticed"] != NOTICED["joined"]) & (m["left"] >= 0)))
        failures = failure_times(run)
        assert len(failures) == deaths > 0, (path.name, failures, m)
        for failure in failures:
            if failure["step"] < run.steps["clock"].shape[1]:  # a death in the final evaluation has no next step
                assert failure["go_on"] is not None and failure["go_on"] > 0, (path.name, failure)


@pytest.mark.parametrize("algo", HEALED)
def test_a_healed_run_fills_every_row_a_failure_emptied(algo):
    """With more spares than failures, each row that died before the last
    step is taken again, and the run ends on all its ranks: every row
    completed the last step.  The replacement's first step is the one the
    survivors go on with (it joins at their next step), so both times are
    the same but for the ranks' clocks; ensemble_sync's survivors go on
    without the dead rank at once, and its replacement joins at the end of
    the round that waited for every living rank, later."""
    path = RESULTS / f"{algo}_healed.h5"
    run = load_run(str(path))
    assert _status(path) == 0 and run.attrs["status"] == "complete", path.name
    m = run.membership
    last = run.steps["clock"].shape[1]
    joined = int(np.sum(m["noticed"] == NOTICED["joined"]))
    died = int(np.sum((m["noticed"] != NOTICED["joined"]) & (m["left"] >= 0) & (m["step"] < last)))
    assert joined == died > 0, (path.name, m)
    assert np.all(np.isfinite(run.steps["clock"][:, -1])), path.name
    replaced = [f for f in failure_times(run) if f["joined"] is not None]
    assert len(replaced) == died, (path.name, replaced)
    for failure in replaced:
        if algo == "ensemble_sync":
            assert failure["joined"] > failure["go_on"] - 0.5, (path.name, failure)
        else:
            assert abs(failure["joined"] - failure["go_on"]) < 0.5, (path.name, failure)
