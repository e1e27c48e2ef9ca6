"""The MPI test runner ends the job when one rank fails while others block."""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from launcher import mpiexec

ROOT = Path(__file__).resolve().parent.parent
RUNNER = ROOT / "scripts" / "mpi-pytest"
DELIBERATE = "tests/harness/deliberate_failure_mpi.py"
SUBPROCESS_TIMEOUT = 120  # seconds; the job normally ends within a few


@pytest.mark.launcher
@pytest.mark.timing  # the job must end well before its deadline
@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec found")
def test_failure_on_one_rank_ends_the_job(tmp_path):
    env = dict(
        os.environ,
        PYTHON=sys.executable,
        MPIEXEC=mpiexec(),
        MPI_PYTEST_LOGDIR=str(tmp_path / "logs"),
        MPI_PYTEST_TIMEOUT=str(SUBPROCESS_TIMEOUT),
    )
    args = [str(RUNNER), "2", DELIBERATE, "--timeout=60", "--timeout-method=thread"]
    start = time.monotonic()
    try:
        proc = subprocess.run(
            args,
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=SUBPROCESS_TIMEOUT + 30,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the job still ran after {exc.timeout} s: rank 0 was left blocked")
    elapsed = time.monotonic() - start
    end = time.time()
    output = proc.stdout + proc.stderr

    failed_at = re.search(r"deliberate failure on rank 1 at unix time ([0-9.]+)", output)
    latency = f"{end - float(failed_at.group(1)):.1f} s" if failed_at else "unknown"
    info = f"exit status {proc.returncode}, ran {elapsed:.1f} s, {latency} from the failure to the exit\n{output}"
    assert proc.returncode != 0, info
    assert proc.returncode != 124, f"the job timed out instead of aborting: {info}"
    assert elapsed < SUBPROCESS_TIMEOUT, info
    assert failed_at is not None, f"rank 1's failure is missing from the report: {info}"
    assert "==== rank 1 of 2 ====" in output, info
    # Rank 0's report was shown live, before the failing rank's report.
    assert 0 <= output.find("collected 1 item") < output.index("==== rank 1 of 2 ===="), info
    # One line with the counts over all ranks, the per-rank lines, then pytest's own closing line.
    assert re.search(
        r"^mpi-pytest: 2 ranks, 1 finished, ranks with failures or errors: 1; "
        r"over all ranks 0 passed, 1 failed, 0 errors, 0 skipped; exit status 1 after",
        output,
        re.M,
    ), info
    assert "  rank 0: (no summary: ended before pytest finished)" in output, info
    assert re.search(r"=+ 1 failed in [0-9.]+s =+\s*$", proc.stdout), info
