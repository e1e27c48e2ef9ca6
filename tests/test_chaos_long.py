"""The chaos campaign's long run (experiments.chaos_campaign.run_long), from its run files in results/chaos/

The long table must be what the run files give; the run must have taken
a hundred failures at least, each row a failure emptied taken again by a
spare while spares lasted; and the table refuses to judge a run without
the failure-free runs it is judged against.
"""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from experiments.chaos_campaign import failure_times, tabulate_long
from wagma.results import NOTICED, load_run

RESULTS = Path(__file__).resolve().parent.parent / "results" / "chaos"
LONG = RESULTS / "long_healed.h5"
FREE = sorted(RESULTS.glob("long_free_s*.h5"))


def _copy(paths, into):
    for path in paths:
        shutil.copy(path, into)


def test_the_committed_long_table_is_what_the_run_files_give(tmp_path):
    _copy([LONG, Path(f"{LONG}.status"), *FREE], tmp_path)
    tabulate_long(str(tmp_path))
    assert (tmp_path / "long.md").read_text() == (RESULTS / "long.md").read_text()


def test_the_long_run_took_a_hundred_failures_and_a_spare_for_each_while_they_lasted():
    """The campaign's ask (``--long-failures 100``): a hundred failures at
    least struck the run, every one matched to a strike of its plan; it
    completed, and every row a failure emptied before the last step was
    taken again by a spare, up to the spares the job started with (a join
    that another failure interrupts costs none: collectives.spares)."""
    run = load_run(str(LONG))
    assert int(Path(f"{LONG}.status").read_text()) == 0 and run.attrs["status"] == "complete"
    m = run.membership
    last = run.steps["clock"].shape[1]
    died = int(np.sum((m["noticed"] != NOTICED["joined"]) & (m["left"] >= 0) & (m["step"] < last)))
    joined = int(np.sum(m["noticed"] == NOTICED["joined"]))
    spares = json.loads(run.attrs["config"])["spares"]
    assert len(failure_times(run)) >= 100 and died >= 100, died
    assert joined == min(died, spares), (joined, died, spares)


def test_the_long_table_needs_the_failure_free_runs_of_three_seeds(tmp_path):
    _copy([LONG, Path(f"{LONG}.status"), *FREE[:2]], tmp_path)
    with pytest.raises(ValueError, match="two others at least"):
        tabulate_long(str(tmp_path))
