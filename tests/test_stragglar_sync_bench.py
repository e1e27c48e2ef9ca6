"""``python -m collectives.bench stragglar --delay-factors``: the ratios and tables, and a real 4-rank job."""

import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from launcher import mpiexec, mpiexec_command

from collectives.bench.stragglar import SYNC_IMPLEMENTATIONS, sync_speedups, sync_table, sync_wins

ROOT = Path(__file__).resolve().parent.parent

# Median totals in seconds [implementation, factor] in SYNC_IMPLEMENTATIONS order:
# stragglar, stragglar_wrong, ring, rhd, MPI_Allreduce, predicted.
TOTALS = np.array(
    [
        [0.010, 0.012, 0.020],
        [0.012, 0.024, 0.030],
        [0.008, 0.015, 0.025],
        [0.009, 0.016, 0.030],
        [0.007, 0.013, 0.022],
        [0.0007, 0.013, 0.020],
    ]
)


def _bench(*args):
    return subprocess.run(
        [*mpiexec_command(4), sys.executable, "-m", "mpi4py", "-m", "collectives.bench", "stragglar", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_speedups_are_the_others_time_over_stragglars_and_slowdowns_over_ring_and_right():
    r = sync_speedups(TOTALS)
    assert r["over_ring"] == pytest.approx([0.8, 1.25, 1.25])
    assert r["over_rhd"] == pytest.approx([0.9, 16 / 12, 1.5])
    assert r["over_MPI_Allreduce"] == pytest.approx([0.7, 13 / 12, 1.1])
    assert r["wrong_vs_ring"] == pytest.approx([1.5, 1.6, 1.2])
    assert r["wrong_vs_right"] == pytest.approx([1.2, 2.0, 1.5])
    assert r["predicted_vs_MPI_Allreduce"] == pytest.approx([0.1, 1.0, 20 / 22])
    # Any leading axes: [implementation, size, factor] gives [size, factor].
    assert sync_speedups(np.stack([TOTALS, TOTALS], axis=1))["over_ring"].shape == (2, 3)


def test_stragglar_wins_where_it_beats_ring_rhd_and_mpi_but_not_its_wrong_twin():
    assert sync_wins([0, 1, 2], TOTALS) == [1, 2]
    totals = TOTALS.copy()
    totals[4, 1] = 0.011  # MPI_Allreduce faster at factor 1
    totals[1, 2] = 0.001  # the wrong prediction is no rival
    totals[5, 2] = 0.001  # nor is the training's synchronization, which may run StragglAR
    assert sync_wins([0, 1, 2], totals) == [2]


def test_the_table_has_a_row_per_factor_with_times_in_ms_and_the_ratios():
    lines = sync_table([0, 0.5, 2], [0.0, 0.004, 0.016], TOTALS).splitlines()
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    assert head == (
        ["factor", "delay ms"]
        + [f"{n} ms" for n in SYNC_IMPLEMENTATIONS]
        + ["S/ring", "S/rhd", "S/MPI", "wrong/ring", "wrong/right", "pred/MPI"]
    )
    assert lines[1] == "|" + "---:|" * len(head)
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    assert rows[1] == ["0.5", "4.0", "12.0", "24.0", "15.0", "16.0", "13.0", "13.0"] + [
        "1.25",
        "1.33",
        "1.08",
        "1.60",
        "2.00",
        "1.00",
    ]
    assert [row[0] for row in rows] == ["0", "0.5", "2"]
    # Below a millisecond, three decimals: a small buffer's times are tenths of one.
    assert rows[0][1:3] == ["0.000", "10.0"] and rows[0][7] == "0.700"


@pytest.mark.launcher
@pytest.mark.timing  # the late rank sleeps; every total must last the sleep
@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec found")
def test_a_4_rank_run_writes_every_field_and_checks_the_wrong_prediction(tmp_path):
    out = tmp_path / "sync" / "sync_n4.h5"
    job = _bench("--sizes-mib", "0.25", "--delay-factors", "0,1", "--reps", "1", "--out", str(out))
    assert job.returncode == 0, job.stdout + job.stderr
    assert "## 0.25 MiB" in job.stdout and "wrong/ring" in job.stdout
    table = (tmp_path / "sync" / "sync_n4.md").read_text()
    assert "4 ranks" in table and f"({os.cpu_count()} cores)" in table
    assert table.count("\n| ") == 1 + 2  # the header and one row per factor
    assert "`predicted` ran StragglAR at this share of its synchronizations: 0% at factor 0" in table
    with h5py.File(out) as f:
        assert (
            f.attrs["mode"],
            f.attrs["ranks"],
            f.attrs["late_rank"],
            f.attrs["wrong_prediction"],
            f.attrs["rounds"],
        ) == ("sync", 4, 3, 0, 4)
        assert f.attrs["check_passed"] and f.attrs["git_commit"] and f.attrs["mpi_library"]
        names = [name.decode() for name in f["implementations"][()]]
        assert names == list(SYNC_IMPLEMENTATIONS)
        assert list(f["sizes_bytes"][()]) == [2**18] and list(f["delay_factors"][()]) == [0, 1]
        base = f["ring_no_delay_median_s"][()]
        assert f["ring_no_delay_seconds"].shape == (1, 1) and base[0] > 0
        assert f["delays_s"][()] == pytest.approx(np.outer(base, [0, 1]))
        seconds = f["seconds"][()]
        assert seconds.shape == (6, 1, 2, 1, 2) and np.all(seconds[..., 0] > 0)
        # With the late rank asleep, every implementation's total lasts the sleep.
        assert np.all(seconds[:, 0, 1, :, 0] >= f["delays_s"][0, 1])
        totals = f["median_total_s"][()]
        assert totals == pytest.approx(np.median(seconds[..., 0], axis=3))
        assert f["speedup_over_ring"][()] == pytest.approx(totals[2] / totals[0])
        for name in (
            "speedup_over_ring",
            "speedup_over_rhd",
            "speedup_over_MPI_Allreduce",
            "wrong_vs_ring",
            "wrong_vs_right",
            "predicted_vs_MPI_Allreduce",
        ):
            assert f[name].shape == f[f"paired_{name}"].shape == (1, 2)
        # One repetition: the median of the per-repetition ratios is the ratio.
        assert f["paired_wrong_vs_ring"][()] == pytest.approx(totals[1] / totals[2])
        assert f.attrs["loadavg_before"] >= 0 and f.attrs["loadavg_after"] >= 0
        ran = f["predicted_ran_stragglar"][()]
        assert ran.shape == (1, 2) and np.all((ran >= 0) & (ran <= 1))
        assert ran[0, 0] == 0  # nobody late, nobody leads: never StragglAR
        errors = f["check_max_abs_error"][()]
        assert errors.shape == (6, 1) and errors[names.index("stragglar_wrong"), 0] == 0
        assert np.all(errors <= f.attrs["check_tolerance"])


BROKEN = """
import sys
from collectives.bench import stragglar
from collectives.stragglar.runtime import StragglerAwareAllreduce
call = StragglerAwareAllreduce.__call__
def broken(self, data, check=True):
    call(self, data, check=check)
    if self.straggler != self.comm.size - 1 and self.comm.rank == 1:
        data[5] += 1                          # only the wrong prediction's plan
    return data
StragglerAwareAllreduce.__call__ = broken
stragglar.main(sys.argv[1:])
"""


@pytest.mark.launcher
@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec found")
def test_a_wrong_sum_fails_the_run_naming_the_implementation(tmp_path):
    job = subprocess.run(
        [
            *mpiexec_command(4),
            sys.executable,
            "-m",
            "mpi4py",
            "-c",
            BROKEN,
            "--sizes-mib",
            "0.25",
            "--delay-factors",
            "0",
            "--reps",
            "1",
            "--out",
            str(tmp_path / "x.h5"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert job.returncode != 0
    assert "wrong allreduce result at 0.25 MiB on 4 ranks" in job.stderr
    assert "stragglar_wrong by 1" in job.stderr and not (tmp_path / "x.h5").exists()
