"""Jobs that end early: killed (a readable file), signalled (checkpoint, resume), refused (bad rank count).

Real jobs: ``mpiexec -n 2 python -m experiments.train`` in a subprocess,
killed with SIGKILL or sent SIGUSR1 (what ``sbatch --signal`` delivers before
the time limit) while it trains.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from launcher import mpiexec, mpiexec_command, steps_written

from wagma.results import STEP_FIELDS, load_run, partial_path, rows_path
from wagma.results.journal import STEP_WIDTH, read_rows

ROOT = Path(__file__).resolve().parent.parent
RANKS = 2
STEPS = 120
# Rank 1 is LATE_S late at every step, so no run does more than one step per
# LATE_S: when rank 0 first writes the partial file (RunRecorder flushes at
# most every 2 s) a job has done at most about 2 s / LATE_S = 40 steps, and a
# kill or a stop sent as soon as the file shows its first steps lands well
# before step STEPS, however fast the machine (at 15 ms, up to 130 steps
# could be done by then).
LATE_S = 0.05
COMMAND = [
    "--algo",
    "local_sgd",
    "--period",
    "4",
    "--dataset",
    "digits",
    "--epochs",
    "100",
    "--max-steps",
    str(STEPS),
    "--imbalance",
    f"straggler:rank=1,ms={LATE_S * 1e3:g}",
    "--no-progress",
]
DEADLINE = 120  # seconds for any one job

# Signals sent while a job runs, a straggler's delay, deadlines: all timing.
pytestmark = [
    pytest.mark.launcher,
    pytest.mark.timing,
    pytest.mark.skipif(mpiexec() is None, reason="no mpiexec found"),
]


def _start(args):
    return subprocess.Popen(
        [*mpiexec_command(RANKS), sys.executable, "-m", "experiments.train", *args],
        cwd=ROOT,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait_until_written(job, path, steps):
    start = time.monotonic()
    while steps_written(path) < steps:
        assert job.poll() is None, f"the job ended before writing {steps} steps:\n{job.stdout.read()}"
        assert time.monotonic() - start < DEADLINE, "the run file never reached that step"
        time.sleep(0.05)


def _ranks_of(job):
    """PIDs of the job's rank processes: descendants of its launcher (hydra
    starts them in sessions of their own) that run the training."""
    table = [
        line.split(None, 2)
        for line in subprocess.run(
            ["ps", "-e", "-o", "pid=,ppid=,args="], capture_output=True, text=True, check=True
        ).stdout.splitlines()
    ]
    family, ranks = {job.pid}, []
    for _ in range(3):  # mpiexec -> proxy -> ranks
        family |= {int(pid) for pid, ppid, *_ in table if int(ppid) in family}
    for pid, ppid, *args in table:
        if int(pid) in family and "experiments.train" in " ".join(args) and "mpiexec" not in " ".join(args):
            ranks.append(int(pid))
    return ranks


def test_a_killed_run_leaves_a_readable_file_with_what_it_measured(tmp_path):
    out = tmp_path / "killed.h5"
    job = _start([*COMMAND, "--out", str(out)])
    _wait_until_written(job, partial_path(str(out)), 20)
    ranks = _ranks_of(job)
    assert len(ranks) == RANKS
    for pid in ranks:  # rank 0, the writer, included
        os.kill(pid, signal.SIGKILL)
    job.wait(timeout=DEADLINE)
    assert not out.exists()
    run = load_run(partial_path(str(out)))
    assert run.attrs["status"] == "running"
    written = run.steps["clock"].shape[1]
    assert 20 <= written < STEPS
    for name, values in run.steps.items():
        assert values.shape == (RANKS, written), name
        # Only the partial collectives have a contribution iteration: local SGD's is NaN.
        assert np.all(np.isnan(values) if name == "contribution" else np.isfinite(values)), name
    assert np.all(run.steps["delay"][1] == LATE_S) and np.all(run.steps["delay"][0] == 0)


@pytest.fixture(scope="module")
def requeued(tmp_path_factory):
    """A job told to stop (SIGUSR1 to one rank) stops at a checkpoint, every
    rank with it; the requeued job, the same command line, runs it to the end.
    Returns the command line, the run file and the checkpoint folder, and
    what the stop had left: its checkpoint record.  Shared by the two tests
    below: the second resumes this finished run once more (a run of its own
    would be one more training job of about 20 s)."""
    tmp_path = tmp_path_factory.mktemp("requeued")
    out, checkpoints = tmp_path / "requeued.h5", tmp_path / "ckpt"
    args = [*COMMAND, "--out", str(out), "--checkpoint-dir", str(checkpoints), "--stop-check-every", "10", "--resume"]
    job = _start(args)
    _wait_until_written(job, partial_path(str(out)), 15)
    ranks = _ranks_of(job)
    assert len(ranks) == RANKS
    os.kill(ranks[-1], signal.SIGUSR1)  # one rank is told; all must stop together
    output = job.communicate(timeout=DEADLINE)[0]
    assert job.returncode == 75, output
    stopped = json.loads((checkpoints / "latest.json").read_text())
    assert stopped["ranks"] == RANKS and stopped["step"] % 10 == 0 and 15 <= stopped["step"] < STEPS
    first = load_run(partial_path(str(out)))
    assert first.attrs["status"] == "stopped" and first.steps["clock"].shape[1] == stopped["step"]

    job = _start(args)  # the requeued job: same command line
    output = job.communicate(timeout=DEADLINE)[0]
    assert job.returncode == 0, output
    return SimpleNamespace(args=args, out=out, checkpoints=checkpoints, stopped=stopped)


def test_a_signalled_run_stops_at_a_checkpoint_and_resume_continues_the_step_counter(requeued):
    out, checkpoints, stopped = requeued.out, requeued.checkpoints, requeued.stopped
    run = load_run(str(out))
    assert run.attrs["status"] == "complete"
    assert list(run.attrs["resumed_at"]) == [stopped["step"]]
    clock = run.steps["clock"]
    assert clock.shape == (RANKS, STEPS) and np.all(np.isfinite(clock))
    assert np.all(np.diff(clock, axis=1) > 0)  # the training clock went on from the checkpoint
    np.testing.assert_array_equal(run.steps["delay"][1], LATE_S)
    # The algorithm's own counter went on from the checkpoint to the end.
    final = json.loads((checkpoints / "latest.json").read_text())
    assert final["step"] == STEPS
    state = torch.load(checkpoints / f"rank00000.step{STEPS:09d}.pt", weights_only=True)
    assert state["algorithm"]["steps"] == STEPS and state["step"] == STEPS
    # Evaluations before the stop were kept, the later ones appended in order.
    assert np.all(np.diff(run.eval["step"]) > 0) and run.eval["step"][-1] == STEPS


def _contents(folder):
    """``{path: bytes}`` of every file under ``folder``."""
    return {str(f): f.read_bytes() for f in sorted(folder.rglob("*")) if f.is_file()}


def test_resume_of_a_finished_run_changes_nothing(requeued):
    """The requeued run above, finished, started once more with its command line."""
    before = _contents(requeued.out.parent)  # the run file and the checkpoints
    job = _start(requeued.args)
    output = job.communicate(timeout=DEADLINE)[0]
    assert job.returncode == 0, output
    assert "nothing left to run" in output
    assert load_run(str(requeued.out)).steps["clock"].shape == (RANKS, STEPS)
    assert _contents(requeued.out.parent) == before, "the run file or a checkpoint changed"


def test_a_rank_count_the_algorithm_rejects_fails_before_set_up(tmp_path):
    """The algorithm's check of its options against the rank count (a group of
    4 out of 3 ranks) comes before the data and the model are loaded: with a
    data folder that does not exist as well, the error reported is the rank
    count's, in the command line's words (-n and --group-size, not world_size)."""
    out = tmp_path / "never.h5"
    job = subprocess.run(
        [
            *mpiexec_command(3),
            sys.executable,
            "-m",
            "experiments.train",
            "--algo",
            "wagma",
            "--group-size",
            "4",
            "--dataset",
            "cifar10",
            "--data-dir",
            str(tmp_path / "no-such-folder"),
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    assert job.returncode == 2
    assert (
        job.stderr.count("--algo wagma: --group-size must be an int from 1 to 3 ranks (mpiexec -n), or 'auto', got 4")
        == 1
    ), job.stderr
    assert "no-such-folder" not in job.stderr and "world_size" not in job.stderr and "group_size" not in job.stderr
    assert not out.exists() and not Path(partial_path(str(out))).exists()


def test_an_error_on_one_rank_reaches_the_user_with_its_rank_and_ends_the_job(tmp_path):
    """Rank 1 cannot write its checkpoint of step 10 (a directory is in the
    way, as a full or broken disk on one node would): the job must end with
    rank 1's traceback, not hang with rank 0 waiting for it."""
    out, checkpoints = tmp_path / "broken.h5", tmp_path / "ckpt"
    (checkpoints / "rank00001.step000000010.pt.tmp").mkdir(parents=True)
    job = _start([*COMMAND, "--out", str(out), "--checkpoint-dir", str(checkpoints), "--checkpoint-every", "10"])
    output = job.communicate(timeout=DEADLINE)[0]
    assert job.returncode != 0
    assert "[rank 1] Traceback" in output and "Is a directory" in output, output
    assert "[rank 0] Traceback" not in output
    run = load_run(partial_path(str(out)))  # what rank 0 had written stays readable
    assert run.attrs["status"] in ("running", "failed")


KILLED_RANKS, VICTIM, KILL_STEP, PERIOD = 4, 2, 60, 4


def _file_rows(path, rank):
    """Rank ``rank``'s steps in the run file at ``path``: where its clock is set."""
    return np.flatnonzero(np.isfinite(load_run(path, logs=False).steps["clock"][rank]))


def test_a_rank_killed_by_its_fault_ends_the_job_and_complete_writes_every_row_the_ranks_logged(tmp_path):
    # Without fault tolerance the launcher ends the job when a rank dies, so
    # no rank closes the run file; every rank's rows are in its log beside
    # it, which the reader merges and `python -m wagma.results complete`
    # writes into the file, marked.
    out = tmp_path / "dies.h5"
    partial = partial_path(str(out))
    job = subprocess.run(
        [
            *mpiexec_command(KILLED_RANKS),
            sys.executable,
            "-m",
            "experiments.train",
            *COMMAND,
            "--out",
            str(out),
            "--fault",
            f"kill:rank={VICTIM},step={KILL_STEP}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    assert job.returncode != 0, job.stdout + job.stderr
    assert not out.exists()
    logged = {
        rank: read_rows(os.path.join(rows_path(partial), f"rank-{rank:05d}.f64"), STEP_WIDTH)[0] for rank in range(4)
    }
    # The victim logged its steps before KILL_STEP; the others at least those (they passed the
    # average at the end of step KILL_STEP - 1 with it) and none past the next average, which needed it.
    assert logged[VICTIM][:, 0].tolist() == list(range(KILL_STEP))
    for rank, rows in logged.items():
        assert rows[:, 0].tolist() == list(range(len(rows))), rank
        assert KILL_STEP <= len(rows) < KILL_STEP + PERIOD or rank == VICTIM, rank
    # Nobody closed the file; the reader takes the rows since its last flush from the logs.
    run = load_run(partial)
    assert run.attrs["status"] == "running"
    assert json.loads(run.attrs["faults"]) == [
        {"kind": "kill", "rank": VICTIM, "first": KILL_STEP, "last": KILL_STEP, "seconds": 0.0, "how": "sigkill"}
    ]
    assert run.steps["clock"].shape == (KILLED_RANKS, KILL_STEP)  # the steps every rank reached
    assert np.all(np.isfinite(run.steps["step_time"]))
    np.testing.assert_array_equal(run.steps["delay"][1], LATE_S)

    def complete():
        return subprocess.run(
            [sys.executable, "-m", "wagma.results", "complete", str(out)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=DEADLINE,
        )

    done = complete()
    assert done.returncode == 0, done.stdout + done.stderr
    run = load_run(partial, logs=False)
    assert run.attrs["status"] == "failed: a rank died"
    furthest = max(len(rows) for rows in logged.values())
    assert run.steps["clock"].shape == (KILLED_RANKS, furthest) and run.summary["steps"] == furthest
    for rank, rows in logged.items():  # each rank's rows as far as it got, the victim's to its kill
        np.testing.assert_array_equal(_file_rows(partial, rank), rows[:, 0])
        np.testing.assert_array_equal(run.steps["clock"][rank, : len(rows)], rows[:, 1 + STEP_FIELDS.index("clock")])
    # Once more: nothing changes.
    again = complete()
    assert again.returncode == 0, again.stdout + again.stderr
    rerun = load_run(partial, logs=False)
    np.testing.assert_equal(rerun.attrs, run.attrs)
    np.testing.assert_equal(rerun.summary, run.summary)
    np.testing.assert_equal(rerun.steps, run.steps)


RELAUNCH_STEPS, CHECKPOINT_EVERY, RELAUNCH_KILL = 60, 10, 25


def test_after_a_rank_died_the_ranks_left_resume_from_the_last_checkpoint(tmp_path):
    """Without fault tolerance: what slurm/train-job.sh does after a rank
    died and the launcher ended the job.  The run file is completed and
    marked, the checkpoint drops the dead rank, and the same command line on
    the three ranks left goes on from the checkpoint: rows kept, the dead
    rank's batch shared (the global batch stays the same), the change
    recorded, and Allreduce-SGD's replicas equal at the end."""
    out, checkpoints = tmp_path / "relaunched.h5", tmp_path / "ckpt"
    args = [
        "-m",
        "experiments.train",
        *("--algo", "allreduce_sgd", "--dataset", "digits", "--epochs", "100", "--batch-size", "16"),
        *("--max-steps", str(RELAUNCH_STEPS), "--checkpoint-every", str(CHECKPOINT_EVERY), "--eval-every", "0"),
        *("--checkpoint-dir", str(checkpoints), "--resume", "--out", str(out), "--no-progress"),
        *("--fault", f"kill:rank={VICTIM},step={RELAUNCH_KILL}"),
    ]

    def run(*command, ranks=None):
        prefix = mpiexec_command(ranks) if ranks else []
        return subprocess.run(
            [*prefix, sys.executable, *map(str, command)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=DEADLINE,
        )

    died = run(*args, ranks=KILLED_RANKS)
    assert died.returncode != 0, died.stdout + died.stderr
    died_at = time.time()  # after the launcher ended the job: recovery_s below is at most the relaunch
    marked = run("-m", "wagma.results", "complete", out)
    assert marked.returncode == 0, marked.stderr
    assert load_run(partial_path(str(out)), logs=False).attrs["status"] == "failed: a rank died"
    left = run(
        "-m", "experiments.checkpoint", "without", checkpoints, "--of", KILLED_RANKS, "--died-at", died_at, VICTIM
    )
    assert (left.returncode, left.stdout.strip()) == (0, "3"), left.stderr
    resumed = run(*args, ranks=3)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resumed at step 20 on 3 of the run's 4 ranks (rows [0, 1, 3])" in resumed.stderr

    result = load_run(str(out))
    checkpoint = RELAUNCH_KILL // CHECKPOINT_EVERY * CHECKPOINT_EVERY  # the last one before the death
    assert result.attrs["status"] == "complete" and result.attrs["ranks"] == KILLED_RANKS
    assert list(result.attrs["resumed_at"]) == [checkpoint]
    clock, samples = result.steps["clock"], result.steps["samples"]
    assert clock.shape == (KILLED_RANKS, RELAUNCH_STEPS)
    others = [r for r in range(KILLED_RANKS) if r != VICTIM]
    assert np.all(np.isfinite(clock[others])) and np.all(np.diff(clock[others], axis=1) > 0)
    # The dead rank's steps up to the checkpoint stay; those after it were done again without it.
    assert np.flatnonzero(np.isfinite(clock[VICTIM])).tolist() == list(range(checkpoint))
    np.testing.assert_array_equal(np.nansum(samples, axis=0), KILLED_RANKS * 16)
    membership = result.membership
    assert membership["left"].tolist() == [VICTIM] and membership["step"].tolist() == [checkpoint]
    assert membership["noticed"].tolist() == [5] and membership["ranks_after"].tolist() == [3]  # relaunch
    assert 0 < membership["recovery_s"][0] < DEADLINE
    assert json.loads(result.attrs["dead_ranks"]) == [VICTIM]
    # The last checkpoint holds the three members' replicas, equal, and the dead row's file is gone.
    latest = json.loads((checkpoints / "latest.json").read_text())
    assert latest == {"step": RELAUNCH_STEPS, "ranks": 3, "rows": KILLED_RANKS, "members": others}
    assert sorted(p.name for p in checkpoints.glob("*.pt")) == [
        f"rank{r:05d}.step{RELAUNCH_STEPS:09d}.pt" for r in others
    ]
    models = [torch.load(checkpoints / f"rank{r:05d}.step{RELAUNCH_STEPS:09d}.pt")["model"] for r in others]
    for model in models[1:]:
        assert all(torch.equal(model[k], models[0][k]) for k in model)
