"""The row logs beside a run file: a rank killed with SIGKILL keeps its rows; complete, a torn file, resume.

Real processes: a one-rank job (a Python process with MPI initialised on its
own) records into a RunRecorder and kills itself with SIGKILL; then
``python -m wagma.results complete`` closes its file, and another resumes it.
Row values are ``step`` in every field but ``loss``, which is ``segment``
(1 for the first process, 2 for the one that resumes).
"""

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from wagma.results import STEP_FIELDS, load_run, partial_path, rows_path
from wagma.results.__main__ import main
from wagma.results.journal import RowLog, read_rows
from wagma.results.writer import FileWriter

ROOT = Path(__file__).resolve().parent.parent
STEPS, FLUSHED, RESUME, END = 40, 5, 30, 50

# A job of one rank: records steps FIRST..LAST-1, flushes the file once after
# step FLUSHED (the root never flushes on its own: an hour), evaluates at
# step 10, then kills itself, or with "close" closes the file.
PROGRAM = """
import os, signal, sys
from mpi4py import MPI
from wagma.results import STEP_FIELDS, RunRecorder
out, first, last, segment, end = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
recorder = RunRecorder(MPI.COMM_WORLD, out, {"algorithm": "test", "batch_size": 2},
                       resume_step=first or None, flush_seconds=3600.0)
recorder.record_tables({"t": ([[1.0, 2.0]], ["a", "b"])})
for step in range(first, last):
    recorder.record(step, **{**dict.fromkeys(STEP_FIELDS, float(step)), "loss": segment})
    if step == 10:
        recorder.record_eval(step=11, epoch=1.0, clock=float(step), accuracy=0.5, loss=1.0)
    if step == %d:
        recorder.flush()
if end == "close":
    recorder.close("complete")
else:
    os.kill(os.getpid(), signal.SIGKILL)
""" % (FLUSHED - 1)


def _job(out, first, last, segment, end):
    return subprocess.run(
        [sys.executable, "-c", PROGRAM, str(out), str(first), str(last), str(segment), end],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _copy(killed, folder):
    """The killed job's partial file and logs, into ``folder`` (each test changes its own copy)."""
    shutil.copy(partial_path(str(killed)), folder)
    shutil.copytree(rows_path(str(killed)), folder / os.path.basename(rows_path(str(killed))))


def test_a_row_cut_short_is_left_out_and_read_when_it_is_whole(tmp_path):
    path = str(tmp_path / "rank-00000.f64")
    log = RowLog(path, 3)
    for i in range(3):
        log.append((i, 10.0 * i, -1.0))
    with open(path, "ab") as f:  # half of a fourth row, as a kill inside os.write would leave
        f.write(np.array([3.0, 30.0, -1.0]).tobytes()[:12])
    rows, offset = read_rows(path, 3)
    np.testing.assert_array_equal(rows, [[0, 0, -1], [1, 10, -1], [2, 20, -1]])
    assert offset == 3 * 3 * 8
    with open(path, "ab") as f:
        f.write(np.array([3.0, 30.0, -1.0]).tobytes()[12:])
    rows, offset = read_rows(path, 3, offset)  # from where the last read stopped
    np.testing.assert_array_equal(rows, [[3, 30, -1]])
    assert offset == 4 * 3 * 8
    log.close()


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    """A one-rank job that recorded STEPS steps and was killed, its file flushed after FLUSHED."""
    out = tmp_path_factory.mktemp("killed") / "run.h5"
    job = _job(out, 0, STEPS, 1, "kill")
    assert job.returncode == -signal.SIGKILL, job.stderr
    return out


def test_a_killed_rank_s_rows_are_read_from_its_log_and_complete_writes_them_once(killed, tmp_path):
    out = tmp_path / "run.h5"
    _copy(killed, tmp_path)
    partial = partial_path(str(out))
    assert load_run(partial, logs=False).steps["clock"].shape == (1, FLUSHED)
    run = load_run(partial)  # the rows after the flush, from the log
    np.testing.assert_array_equal(run.steps["clock"], [np.arange(STEPS)])
    assert run.attrs["status"] == "running"

    assert main(["complete", str(out)]) == 0
    run = load_run(partial, logs=False)
    assert run.attrs["status"] == "failed: a rank died"
    np.testing.assert_array_equal(run.steps["step_time"], [np.arange(STEPS)])
    np.testing.assert_array_equal(run.eval["step"], [11])
    np.testing.assert_array_equal(run.tables["t"], [[1, 2]])
    assert run.summary["steps"] == STEPS and run.summary["samples"] == STEPS * (STEPS - 1) / 2
    with h5py.File(partial) as f:
        assert dict(f["summary"].attrs)["steps"] == STEPS  # the summary is in the file
    # Twice is once (the evaluation, from the file and from the log, once).
    assert main(["complete", str(out), "--status", "failed: again"]) == 0
    again = load_run(partial, logs=False)
    assert again.attrs["status"] == "failed: a rank died"  # a closed file keeps its status
    np.testing.assert_equal(again.steps, run.steps)
    np.testing.assert_equal(again.eval, run.eval)
    assert os.path.isdir(rows_path(str(out)))  # kept, for a resumed run


def test_complete_writes_a_torn_file_afresh_from_the_logs(killed, tmp_path):
    out = tmp_path / "run.h5"
    _copy(killed, tmp_path)
    partial = partial_path(str(out))
    os.truncate(partial, os.path.getsize(partial) // 2)  # as a writer killed while it wrote leaves it
    with pytest.raises(OSError):
        load_run(partial)
    assert main(["complete", partial, "--status", "failed: torn"]) == 0
    run = load_run(partial)
    assert run.attrs["status"] == "failed: torn" and run.attrs["algorithm"] == "test"
    np.testing.assert_array_equal(run.steps["clock"], [np.arange(STEPS)])
    np.testing.assert_array_equal(run.eval["step"], [11])
    assert run.tables == {}  # the root's tables were only in the torn file


def test_a_resumed_run_takes_the_rows_before_its_step_from_the_logs_and_drops_the_later_ones(killed, tmp_path):
    out = tmp_path / "run.h5"
    _copy(killed, tmp_path)
    job = _job(out, RESUME, END, 2, "close")
    assert job.returncode == 0, job.stderr
    assert sorted(os.listdir(tmp_path)) == ["run.h5"]  # complete: no partial file, no logs
    run = load_run(str(out))
    assert run.attrs["status"] == "complete" and list(run.attrs["resumed_at"]) == [RESUME]
    np.testing.assert_array_equal(run.steps["clock"], [np.arange(END)])
    # Steps before RESUME are the killed job's (from its log: its file had FLUSHED), the rest the new one's.
    np.testing.assert_array_equal(run.steps["loss"], [[1.0] * RESUME + [2.0] * (END - RESUME)])
    np.testing.assert_array_equal(run.eval["step"], [11])


def test_complete_says_what_is_missing(tmp_path, caplog):
    assert main(["complete", str(tmp_path / "never.h5")]) == 1
    assert "no run file to complete: neither" in caplog.text and "never.partial.h5" in caplog.text


def test_a_file_flushed_step_by_step_reuses_the_space_of_the_chunks_it_rewrites(tmp_path):
    """Each flush opens the file again and rewrites the compressed chunk it
    extends, elsewhere in the file; the file tracks its free space
    (``fs_persist``), so the next flush reuses it.  8 rows of 5000 steps,
    flushed every 20 steps: the file holds 4.0 times its steps' data
    without that tracking, 1.2 times with it (the rest: the chunks' index
    and the free space not yet reused); the bound lies between the two."""
    writer = FileWriter.create(str(tmp_path / "run.h5"), {"algorithm": "test", "batch_size": 1}, 8, None)
    values = np.random.default_rng(0).random((8, 5000, len(STEP_FIELDS)))
    for lo in range(0, 5000, 20):
        for rank in range(8):
            writer.add_rows(rank, np.column_stack([np.arange(lo, lo + 20), values[rank, lo : lo + 20]]))
        writer.flush()
    with h5py.File(writer.partial, "r") as f:
        np.testing.assert_array_equal(f["steps"]["loss"][:], values[:, :, STEP_FIELDS.index("loss")])
        data = sum(f["steps"][name].id.get_storage_size() for name in STEP_FIELDS)
    assert os.path.getsize(writer.partial) < 1.5 * data, (os.path.getsize(writer.partial), data)
