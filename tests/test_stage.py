"""scripts/stage: nothing a stage started outlives it, however the stage ends.

Real processes and real signals: tests/programs/leaves_processes.py starts
a daemon that ignores SIGTERM, an MPI job of 2 ranks in a session of its
own and, where scripts/local-slurm can start one (root, Slurm installed),
the one-node Slurm with a job running, and leaves them all running. The
stage then exits, runs past its limit, or is sent SIGTERM or SIGINT; or
the runner, or the process that started it, is killed with SIGKILL. Every
process must be gone afterwards.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from launcher import mpiexec

ROOT = Path(__file__).resolve().parent.parent
STAGE = ROOT / "scripts" / "stage"
PROGRAM = Path(__file__).resolve().parent / "programs" / "leaves_processes.py"
GRACE = 2  # the stage's seconds from SIGTERM to SIGKILL
# The limit of the "limit" ending, which ends the stage while the program
# waits: time enough to start it all first (0.5 to 0.8 s alone on 2 cores,
# under MPICH or Open MPI), and every second of it is waited out.
LIMIT = 6
DEADLINE = 120  # seconds for the program to start everything, and for the stage to end

pytestmark = [
    pytest.mark.launcher,
    pytest.mark.timing,
    pytest.mark.skipif(mpiexec() is None, reason="no mpiexec found"),
]


def _slurm_can_start():
    """Why scripts/local-slurm cannot start here, or None when it can."""
    if os.geteuid() != 0:
        return "the one-node Slurm needs root"
    missing = [
        tool
        for tool in ("munged", "slurmctld", "slurmd", "sbatch")
        if subprocess.run(
            ["bash", "-c", f"PATH=$PATH:/usr/sbin:/sbin command -v {tool}"], capture_output=True
        ).returncode
    ]
    return f"{', '.join(missing)} missing (apt-get install slurm-wlm munge)" if missing else None


def _alive(pid):
    """Whether ``pid`` runs (a zombie has ended: it only waits to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _carriers(token):
    """PIDs of the live processes whose WAGMA_STAGE holds ``token``."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(v.startswith(b"WAGMA_STAGE=") and token.encode() in v[12:].split(b":") for v in environ):
            found.append(int(entry))
    return [pid for pid in found if _alive(pid)]


def _started(out, stage):
    """The program's record, once it has started everything."""
    record = out / "processes.json"
    start = time.monotonic()
    while not record.exists():
        assert stage.poll() is None, f"the stage ended first:\n{stage.communicate()[1]}"
        assert time.monotonic() - start < DEADLINE, "the program never started everything"
        time.sleep(0.05)
    return json.loads(record.read_text())


def _working_in(folder):
    """PIDs of the live processes whose working directory lies in ``folder``
    (the stage runs there: what does not carry the token shows here, such as
    a Slurm job step)."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
        if (cwd == str(folder) or cwd.startswith(f"{folder}/")) and _alive(int(entry)):
            found.append(int(entry))
    return found


def _gone(record, folder):
    """Wait (to DEADLINE) until none of the record's processes, no carrier of
    its token and nothing working in ``folder`` is left: the sweep after a
    SIGKILL runs in the guardian, after the runner is gone.  Returns what is
    still there."""
    start = time.monotonic()
    while True:
        left = (
            {name: pid for name, pid in record["pids"].items() if _alive(pid)},
            _carriers(record["token"]),
            _working_in(folder),
        )
        if not any(left) or time.monotonic() - start > DEADLINE:
            return left
        time.sleep(0.1)


ENDINGS = [
    # (how the stage ends, the runner's exit status, with Slurm where it can start)
    ("exit", 0, False),
    ("limit", 124, False),
    ("SIGTERM", 128 + signal.SIGTERM, True),
    ("SIGINT", 128 + signal.SIGINT, False),
    ("SIGKILL", -signal.SIGKILL, True),
    ("SIGKILL of its parent", -signal.SIGKILL, False),
]


@pytest.mark.timeout(3 * DEADLINE)
@pytest.mark.parametrize("ending, status, with_slurm", ENDINGS, ids=[e for e, _, _ in ENDINGS])
def test_nothing_the_stage_started_outlives_it(tmp_path, ending, status, with_slurm):
    slurm_dir = None
    if with_slurm and _slurm_can_start() is None:
        slurm_dir = str(tmp_path / "slurm")
    out = tmp_path / "out"
    out.mkdir()
    program = [
        sys.executable,
        str(PROGRAM),
        str(out),
        "exit" if ending == "exit" else "wait",
        *([slurm_dir] if slurm_dir else []),
    ]
    limit = LIMIT if ending == "limit" else 3 * DEADLINE
    stage = [str(STAGE), "-t", str(limit), "-k", str(GRACE), "--", *program]
    if ending == "SIGKILL of its parent":
        # `; exit` keeps bash from exec'ing the runner: bash stays its parent.
        stage = ["bash", "-c", " ".join(f"'{word}'" for word in stage) + "; exit $?"]
    # It runs in tmp_path: the launcher's path must not be relative to the repository.
    env = dict(os.environ, MPIEXEC=str((ROOT / mpiexec()).resolve()))
    job = subprocess.Popen(
        stage, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        record = _started(out, job)
        assert len(record["pids"]) == 4 + 4 * bool(slurm_dir) and all(map(_alive, record["pids"].values())), record
        if ending == "exit":
            (out / "exit").touch()  # the program exits only now: its processes were seen alive first
        if ending in ("SIGTERM", "SIGINT", "SIGKILL", "SIGKILL of its parent"):
            job.send_signal(getattr(signal, ending.split()[0]))
        _, errors = job.communicate(timeout=DEADLINE)
        assert job.returncode == status, errors
        left = _gone(record, tmp_path)
        assert not any(left), (left, errors)
        if ending == "exit":
            assert "outlived" in errors and "a test or a tool does not stop what it starts" in errors, errors
        if ending == "limit":
            assert f"ran past its limit of {LIMIT} s" in errors, errors
    finally:
        if job.poll() is None:
            job.kill()
        if slurm_dir:
            subprocess.run([str(ROOT / "scripts" / "local-slurm"), "stop", slurm_dir], timeout=60)


def test_bad_arguments_are_refused_before_anything_runs(tmp_path):
    marker = tmp_path / "ran"
    for args, words in (
        (["-t", "0", "--", "touch", str(marker)], "-t must be > 0 and -k >= 0, got -t 0 -k 10"),
        (["-t", "5"], "no command given"),
    ):
        job = subprocess.run([str(STAGE), *args], capture_output=True, text=True, timeout=60)
        assert job.returncode == 2 and words in job.stderr, job.stderr
    assert not marker.exists()
