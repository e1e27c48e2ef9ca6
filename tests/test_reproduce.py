"""``experiments.reproduce --only`` on two small claims: the report has their rows, its figure exists, and every
number in the text is the one in the claim's HDF5 file, which is the one in the file it was measured into."""

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from launcher import mpiexec

from collectives.stragglar.cost import ring_time, stragglar_time
from experiments.reproduce.claims import CLAIMS
from experiments.reproduce.record import REPRODUCED, ClaimResult, Row, read_claim, write_claim
from experiments.reproduce.report import write_report
from experiments.reproduce.stragglar_claims import ALPHA, BETA, SIZE

ROOT = Path(__file__).resolve().parent.parent


def _report_line(report, row):
    """The report's table line of ``row`` (its claim text is unique within the report)."""
    (line,) = [line for line in report.splitlines() if line.startswith(f"| {row.claim.replace('|', chr(92) + '|')} |")]
    return line


@pytest.mark.driver
@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec next to this Python or on PATH")
def test_only_two_claims_writes_their_rows_figure_and_the_numbers_of_their_files(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPIEXEC": mpiexec()}
    job = subprocess.run(
        [
            sys.executable,
            "-m",
            "experiments.reproduce",
            "--only",
            "algorithm1",
            "--only",
            "stragglar-cost",
            "--out-dir",
            str(tmp_path),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    report = (tmp_path / "REPORT.md").read_text()
    records = {name: read_claim(tmp_path / "reproduce" / f"{name}.h5") for name in ("algorithm1", "stragglar-cost")}
    # Only the two claims were measured; the others are listed as not measured.
    assert sorted(p.name for p in (tmp_path / "reproduce").glob("*.h5")) == ["algorithm1.h5", "stragglar-cost.h5"]
    assert report.count("| not measured |") == len(CLAIMS) - 2
    for name, record in records.items():
        assert record["rows"], name
        for row in record["rows"]:
            line = _report_line(report, row)
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            assert cells[1:4] == [row.paper, row.shown, row.verdict], (line, row)
        for figure in record["figures"]:
            path = tmp_path / "reproduce" / name / figure
            assert path.stat().st_size > 10_000, path  # a drawn PNG, not an empty file
            assert f"](reproduce/{name}/{figure})" in report
    # algorithm1: the groups in the report are the ones the 8-rank group allreduce reduced over.
    with h5py.File(tmp_path / "reproduce" / "algorithm1" / "group_example.h5") as f:
        members = f["members"][()]
    for t, row in enumerate(records["algorithm1"]["rows"]):
        groups = sorted({tuple(np.flatnonzero(m)) for m in members[t]})
        assert row.ours_text == " ".join("{" + ",".join(map(str, g)) + "}" for g in groups)
        assert row.verdict == REPRODUCED
    # stragglar-cost: the speedup at n = 256 is Table 1's model with the verified schedule's 262 rounds.
    (at256,) = [r for r in records["stragglar-cost"]["rows"] if "n = 256 (" in r.claim]
    expected = ring_time(256, SIZE, ALPHA, BETA) / stragglar_time(256, SIZE, ALPHA, BETA, 262)
    assert at256.ours == pytest.approx(expected, rel=1e-12)
    assert re.search(rf"\| {re.escape(f'{expected:.2f}')}x \|", _report_line(report, at256))


def test_a_claim_written_and_read_back_keeps_every_field(tmp_path):
    rows = [
        Row("a ratio", "1.26x", 1.2345, "{:.2f}x", verdict=REPRODUCED, why="within 10 %"),
        Row("groups", "{0,1}", ours_text="{0,1}", verdict=REPRODUCED, why="same"),
    ]
    path = write_claim(
        str(tmp_path / "reproduce" / "x.h5"),
        "x",
        "X",
        "wagma",
        ClaimResult("a setting", rows, ["f.png"], ["run.h5"]),
        12.5,
        False,
    )
    record = read_claim(path)
    assert record["rows"][0] == rows[0]
    back = record["rows"][1]
    assert np.isnan(back.ours) and dataclasses.replace(back, ours=0.0) == dataclasses.replace(rows[1], ours=0.0)
    assert (record["setting"], record["figures"], record["sources"], record["seconds"]) == (
        "a setting",
        ["f.png"],
        ["run.h5"],
        12.5,
    )
    assert [r.shown for r in record["rows"]] == ["1.23x", "{0,1}"]


def test_a_row_without_a_known_verdict_is_refused():
    with pytest.raises(ValueError, match="verdict must be one of"):
        Row("a claim", "1x", 1.0, verdict="close enough")


def test_the_report_of_an_empty_folder_lists_every_claim_as_not_measured(tmp_path):
    report = Path(write_report(str(tmp_path))).read_text()
    assert report.count("| not measured |") == len(CLAIMS)
    assert "## Not tested here" in report


def test_unknown_only_names_are_refused_before_anything_runs(tmp_path):
    job = subprocess.run(
        [sys.executable, "-m", "experiments.reproduce", "--only", "figure99", "--out-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert job.returncode == 2
    assert "--only: unknown figure99; accepted: algorithm1, figure4" in job.stderr
    assert not any(tmp_path.iterdir())
