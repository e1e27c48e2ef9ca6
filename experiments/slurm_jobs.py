"""Submitting the sbatch scripts and waiting for their jobs, for campaigns and tests on a Slurm cluster.

The one-node cluster of ``scripts/local-slurm`` is what the tests and the
relaunch campaign use (:func:`local_slurm`); any other is named by
``SLURM_CONF`` in the environment handed to these functions.
"""

import contextlib
import os
import subprocess
import time
from datetime import datetime
from pathlib import Path

__all__ = ["ENDED", "SlurmUnavailable", "job_seconds", "job_state", "local_slurm", "submit", "wait_for"]

ROOT = Path(__file__).resolve().parent.parent
#: The states of a job that has ended (``scontrol show job``'s ``JobState``).
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL")


class SlurmUnavailable(RuntimeError):
    """Slurm cannot start here (not root, packages missing), with the reason."""


@contextlib.contextmanager
def local_slurm(folder, cpus=8):
    """The one-node cluster of ``scripts/local-slurm`` in ``folder``, for the
    ``with`` block: yields the environment to submit with (``SLURM_CONF``);
    stopped, every job with it, when the block ends.

    Raises:
        SlurmUnavailable: with local-slurm's reason, where it cannot start.
        RuntimeError: it failed otherwise.
    """
    script = str(ROOT / "scripts" / "local-slurm")
    start = subprocess.run([script, "start", str(folder), str(cpus)], capture_output=True, text=True, timeout=120)
    if start.returncode == 3:
        raise SlurmUnavailable(start.stderr.strip())
    if start.returncode != 0:
        raise RuntimeError(f"scripts/local-slurm start failed: {start.stderr.strip()}")
    try:
        yield dict(os.environ, SLURM_CONF=str(Path(folder) / "slurm.conf"))
    finally:
        subprocess.run([script, "stop", str(folder)], timeout=60)


def submit(env, settings, script, *options, ranks=4):
    """Submit ``script`` (one node, ``ranks`` tasks) from the repository
    root with ``settings`` exported beside ``env``; returns the job id.

    Raises:
        RuntimeError: sbatch refused it, with sbatch's message.
    """
    job = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "--nodes=1",
            f"--ntasks-per-node={ranks}",
            "--time=10",
            "--export=ALL",
            *options,
            script,
        ],
        cwd=ROOT,
        env={**env, **settings},
        capture_output=True,
        text=True,
        timeout=120,
    )
    if job.returncode != 0:
        raise RuntimeError(f"sbatch refused {script}: {job.stderr.strip()}")
    return job.stdout.strip()


def job_state(env, job):
    """``scontrol show job``'s fields of ``job``."""
    out = subprocess.run(["scontrol", "show", "job", job], env=env, capture_output=True, text=True).stdout
    return dict(item.split("=", 1) for item in out.split() if "=" in item)


def _log_tail(path, lines=40):
    log = Path(path)
    return "".join(log.read_text(errors="replace").splitlines(True)[-lines:]) if log.is_file() else f"(no {path})"


def wait_for(env, jobs, deadline_s):
    """Poll (every 0.5 s: ``sbatch --wait`` looks after 2, 8, then 32 s)
    until every job of ``jobs`` has ended; returns their final states, in
    order.

    Raises:
        TimeoutError: jobs still running after ``deadline_s``, with the end of their logs.
        RuntimeError: a job Slurm no longer knows (it ended before it was first watched).
    """
    start = time.monotonic()
    states = {}
    while len(states) < len(jobs):
        for job in jobs:
            if job in states:  # Slurm forgets an ended job after MinJobAge (300 s by default)
                continue
            state = job_state(env, job)
            if "JobState" not in state:
                raise RuntimeError(f"Slurm no longer knows job {job}: it ended more than MinJobAge ago, unwatched")
            if state["JobState"] in ENDED:
                states[job] = state
        if time.monotonic() - start >= deadline_s:
            running = [job_state(env, job) for job in jobs if job not in states]
            raise TimeoutError(
                f"jobs {[s['JobId'] for s in running]} still running after {deadline_s} s; their logs end:\n"
                + "\n".join(_log_tail(s.get("StdOut", "")) for s in running)
            )
        time.sleep(0.5)
    return [states[job] for job in jobs]


def job_seconds(state):
    """A job's wall time from its final state: from its last start (a
    requeued job starts again) to its end, in Slurm's whole seconds."""
    start, end = (datetime.fromisoformat(state[key]) for key in ("StartTime", "EndTime"))
    return (end - start).total_seconds()
