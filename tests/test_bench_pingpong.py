"""``python -m collectives.bench pingpong`` end to end: real 2- and 4-rank jobs and their HDF5 files."""

import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from launcher import mpiexec, mpiexec_command

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.launcher, pytest.mark.skipif(mpiexec() is None, reason="no mpiexec found")]


def _bench(ranks, *args):
    return subprocess.run(
        [*mpiexec_command(ranks), sys.executable, "-m", "mpi4py", "-m", "collectives.bench", "pingpong", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("ranks, waits", [(2, "spin"), (4, "yield")])
def test_every_pair_times_its_round_trips_and_the_file_holds_alpha_and_beta(tmp_path, ranks, waits):
    out = tmp_path / "pingpong.h5"
    job = _bench(ranks, "--waits", waits, "--mib", "0.25", "--reps", "6", "--warmup", "1", "--out", str(out))
    assert job.returncode == 0, job.stdout + job.stderr
    assert f"| {ranks} |" in job.stdout and f"| {waits} |" in job.stdout
    with h5py.File(out) as f:
        assert f.attrs["waits"] == waits and f.attrs["ranks"] == ranks
        small, large = f["half_round_trip_small_s"][:], f["half_round_trip_large_s"][:]
        # Timed on the even rank of each pair: ranks / 2 pairs x 6 repetitions.
        assert np.isfinite(small).sum() == np.isfinite(large).sum() == ranks // 2 * 6
        assert f.attrs["alpha_s"] == pytest.approx(np.nanmedian(small))
        # beta: what the quarter MiB took beyond alpha, per byte (0 where the
        # noise of a loaded node made it no slower than 8 bytes).
        beta = max(np.nanmedian(large) - np.nanmedian(small), 0.0) / 2**18
        assert f.attrs["beta_s_per_byte"] == pytest.approx(beta)


def test_bad_arguments_are_refused_before_any_message():
    job = _bench(2, "--mib", "0")
    assert job.returncode != 0 and "--mib must be > 0" in job.stderr
