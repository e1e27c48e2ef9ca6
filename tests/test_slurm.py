"""The sbatch scripts on a real one-node Slurm (munge, slurmctld, slurmd started by scripts/local-slurm).

Skipped, with the reason, where Slurm cannot start (not root, packages
missing): `apt-get install slurm-wlm munge` provides them.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from launcher import steps_written
from wagma.results import load_run, partial_path

ROOT = Path(__file__).resolve().parent.parent
DEADLINE = 400   # seconds; a requeued job waits Slurm's requeue delay (about 2 minutes) before it restarts

# Longer than the suite's per-test limit: the requeued job waits out Slurm's requeue delay.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(DEADLINE + 60)]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    folder = tmp_path_factory.mktemp("slurm")
    start = subprocess.run([str(ROOT / "scripts" / "local-slurm"), "start", str(folder), "8"],
                           capture_output=True, text=True, timeout=120)
    if start.returncode == 3:
        pytest.skip(start.stderr.strip())
    assert start.returncode == 0, start.stderr
    env = dict(os.environ, SLURM_CONF=str(folder / "slurm.conf"), PYTHON=sys.executable)
    yield folder, env
    subprocess.run([str(ROOT / "scripts" / "local-slurm"), "stop", str(folder)], timeout=60)


def _submit(env, settings, *sbatch):
    return subprocess.run(["sbatch", "--parsable", "--nodes=1", "--ntasks-per-node=4", "--time=10",
                           "--export=ALL", *sbatch, "slurm/train.sbatch"],
                          cwd=ROOT, env={**env, **settings}, capture_output=True, text=True, timeout=DEADLINE)


def _state(env, job):
    out = subprocess.run(["scontrol", "show", "job", job], env=env, capture_output=True, text=True).stdout
    return dict(item.split("=", 1) for item in out.split() if "=" in item)


def test_a_training_job_runs_four_ranks_and_writes_its_run_file(slurm):
    folder, env = slurm
    results = folder / "train"
    job = _submit(env, {"ALGO": "wagma", "MODEL": "resnet20", "DATASET": "synthetic", "EPOCHS": "1",
                        "BATCH_SIZE": "8", "TRAIN_ARGS": "--synthetic-size 64", "RESULTS_DIR": str(results)},
                  "--wait", f"--output={folder}/train-%j.out")
    assert job.returncode == 0, job.stderr + (folder / f"train-{job.stdout.strip()}.out").read_text()
    job_id = job.stdout.strip()
    assert _state(env, job_id)["ExitCode"] == "0:0"
    run = load_run(str(results / f"wagma_{job_id}.h5"))
    assert (run.attrs["status"], run.attrs["ranks"], run.attrs["model"]) == ("complete", 4, "resnet20")
    assert run.steps["clock"].shape == (4, 8) and np.all(np.isfinite(run.steps["clock"]))


def test_a_job_warned_of_its_time_limit_checkpoints_requeues_and_finishes(slurm):
    folder, env = slurm
    results = folder / "requeue"
    job = _submit(env, {"ALGO": "local_sgd", "MODEL": "mlp", "DATASET": "digits", "EPOCHS": "100",
                        "BATCH_SIZE": "16", "IMBALANCE": "straggler:rank=1,ms=20",
                        "TRAIN_ARGS": "--max-steps 600 --stop-check-every 10", "RESULTS_DIR": str(results)},
                  f"--output={folder}/requeue-%j.out")
    assert job.returncode == 0, job.stderr
    job_id = job.stdout.strip()
    partial = partial_path(str(results / f"local_sgd_{job_id}.h5"))
    start = time.monotonic()
    while steps_written(partial) < 20:          # signalled mid-run, once it has trained a little
        assert time.monotonic() - start < DEADLINE, f"the job never trained: {_state(env, job_id)}"
        time.sleep(0.2)
    # What --signal=USR1@120 delivers before the time limit: SIGUSR1 to every rank.
    subprocess.run(["scancel", "--signal=USR1", job_id], env=env, check=True)
    while (state := _state(env, job_id))["JobState"] not in ("COMPLETED", "FAILED", "CANCELLED"):
        assert time.monotonic() - start < DEADLINE, f"job still {state['JobState']}"
        time.sleep(1.0)
    log = (folder / f"requeue-{job_id}.out").read_text()
    assert state["JobState"] == "COMPLETED" and state["Restarts"] == "1", log
    assert "requeueing job" in log and "(restart 1)" in log
    run = load_run(str(results / f"local_sgd_{job_id}.h5"))
    assert run.attrs["status"] == "complete" and len(run.attrs["resumed_at"]) == 1
    assert run.steps["clock"].shape == (4, 600)
    assert np.all(np.diff(run.steps["clock"], axis=1) > 0)
