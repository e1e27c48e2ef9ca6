"""experiments.mpirun: the sessions killed Open MPI launchers leave behind are removed before a launch."""

import os
import signal
import subprocess
import sys

import pytest

from experiments.mpirun import launcher_library, remove_stale_sessions
from tests.launcher import mpiexec, mpiexec_command

# Rank 0 prints every rank's pid once all are up, then waits for a line on its standard input.
WAITING_PROGRAM = """
import os, sys
from mpi4py import MPI
pids = MPI.COMM_WORLD.gather(os.getpid())
if MPI.COMM_WORLD.rank == 0:
    print(*pids, flush=True)
    sys.stdin.readline()
MPI.COMM_WORLD.Barrier()
"""


def _start():
    """A 2-rank Open MPI job, once every rank is up, and its ranks' pids."""
    job = subprocess.Popen(
        [*mpiexec_command(2), sys.executable, "-c", WAITING_PROGRAM],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    return job, [int(pid) for pid in job.stdout.readline().split()]


@pytest.mark.launcher
@pytest.mark.skipif(
    mpiexec() is None or launcher_library(mpiexec()) != "openmpi", reason="Open MPI's launcher keeps these sessions"
)
def test_a_killed_launchers_session_is_removed_and_a_running_ones_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the launchers' sessions, and the only ones removed
    killed, ranks = _start()
    for pid in [killed.pid, *ranks]:
        os.kill(pid, signal.SIGKILL)
    killed.wait(timeout=60)
    left = tmp_path / f"ompi.{killed.pid}"
    # What makes this needed: a launcher killed by a signal keeps its session, rendezvous files included.
    assert left.is_dir() and any(name.startswith("pmix.") for name in os.listdir(left))

    not_sessions = [tmp_path / "ompi.abc", tmp_path / f"ompi.{killed.pid}.txt"]
    for path in not_sessions:
        path.mkdir()
    running, _ = _start()  # mpiexec_command removed the killed launcher's session before this one began
    try:
        assert not left.exists()
        assert (tmp_path / f"ompi.{running.pid}").is_dir()
        assert remove_stale_sessions() == []  # a running launcher's session stays, and so does what is not a session
        assert (tmp_path / f"ompi.{running.pid}").is_dir() and all(path.is_dir() for path in not_sessions)
    finally:
        running.stdin.write("go\n")
        running.stdin.close()
        assert running.wait(timeout=60) == 0
    assert not (tmp_path / f"ompi.{running.pid}").exists()  # a launcher that exits removes its own


def test_a_session_folder_whose_pid_is_gone_is_removed_and_nothing_else(tmp_path):
    """Gone: a pid no process has, and this process's own (which execs the
    launcher in ``experiments.mpirun``'s main); kept: a running process's."""
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = [tmp_path / f"ompi.{gone.stdout.strip()}", tmp_path / f"ompi.{os.getpid()}"]
    live = tmp_path / f"ompi.{os.getppid()}"
    for path in (stale[0] / "1", stale[1], live):
        path.mkdir(parents=True)
    assert sorted(remove_stale_sessions(str(tmp_path))) == sorted(map(str, stale))
    assert live.is_dir() and not any(path.exists() for path in stale)
    assert remove_stale_sessions(str(tmp_path / "absent")) == []
