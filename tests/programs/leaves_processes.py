"""A stage that starts processes the way the tests do, and does not stop them.

Run by tests/test_stage.py as
``scripts/stage -- python leaves_processes.py OUT_DIR MODE [SLURM_DIR]``.
It starts

* a daemon: a process that forks twice into a session of its own (as
  munged and slurmd do) and ignores SIGTERM, so that only SIGKILL ends it;
* an MPI job of 2 ranks with ``experiments.mpirun``'s launcher words, in a
  session of its own as tests/test_train_restart.py starts its jobs, each
  rank waiting for ever;
* with SLURM_DIR, the one-node Slurm of scripts/local-slurm and a job in it
  that waits for ever,

writes OUT_DIR/processes.json (``token``: its WAGMA_STAGE; ``pids``: name ->
PID, every process it started, the ranks and the Slurm job's shell
included) once all of them run, and then waits for ever (MODE ``wait``) or
exits once OUT_DIR/exit exists (MODE ``exit``: the test makes it after it
has seen every process alive, so that the stage's sweep cannot come first).
PIDs are read from files each process writes itself: readiness is a file
that exists, never a guess.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from experiments.mpirun import mpiexec_command  # noqa: E402

# What each process runs: write its PID to argv[1] (plus its MPI rank, under
# mpiexec), then wait for ever; --ignore-term: SIGTERM does not end it.
WAITER = """import os, signal, sys
rank = os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", ""))
if "--ignore-term" in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
with open(sys.argv[1] + rank + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename(sys.argv[1] + rank + ".tmp", sys.argv[1] + rank)
while True:
    signal.pause()
"""
DEADLINE = 120  # seconds for everything to start


def _daemon(waiter, pid_file):
    """A process that double-forks into a session of its own, ignores
    SIGTERM and waits for ever, writing its PID to ``pid_file``."""
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv(sys.executable, [sys.executable, str(waiter), str(pid_file), "--ignore-term"])
        os._exit(0)
    os.wait()


def _wait_for(path):
    """The content of ``path`` once it exists (an integer, or None for an
    empty file)."""
    start = time.monotonic()
    while not path.exists():
        if time.monotonic() - start > DEADLINE:
            sys.exit(f"leaves_processes: {path} never appeared")
        time.sleep(0.05)
    text = path.read_text()
    return int(text) if text else None


def main(out_dir, mode, slurm_dir=None):
    out = Path(out_dir)
    waiter = out / "waiter.py"
    waiter.write_text(WAITER)
    pids = {}
    _daemon(waiter, out / "daemon.pid")
    pids["daemon"] = _wait_for(out / "daemon.pid")
    job = subprocess.Popen(
        [*mpiexec_command(2), sys.executable, str(waiter), str(out / "rank-")],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
    )
    pids["mpiexec"] = job.pid
    for rank in range(2):
        pids[f"rank {rank}"] = _wait_for(out / f"rank-{rank}")
    if slurm_dir:
        started = subprocess.run(
            [str(ROOT / "scripts" / "local-slurm"), "start", slurm_dir, "2"], capture_output=True, text=True
        )
        if started.returncode != 0:
            sys.exit(f"leaves_processes: local-slurm: {started.stderr.strip()}")
        for daemon in ("munged", "slurmctld", "slurmd"):
            pids[daemon] = int(Path(slurm_dir, f"{daemon}.pid").read_text())
        env = dict(os.environ, SLURM_CONF=str(Path(slurm_dir) / "slurm.conf"))
        subprocess.run(
            [
                "sbatch",
                "--parsable",
                "-n",
                "1",
                "--output=/dev/null",
                f"--wrap=exec {sys.executable} {waiter} {out / 'slurm-job'}",
            ],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        pids["slurm job"] = _wait_for(out / "slurm-job")
    record = {"token": os.environ["WAGMA_STAGE"].split(":")[-1], "pids": pids}
    (out / "processes.json.tmp").write_text(json.dumps(record))
    (out / "processes.json.tmp").rename(out / "processes.json")
    if mode == "exit":
        _wait_for(out / "exit")
    while mode == "wait":
        signal.pause()


if __name__ == "__main__":
    main(*sys.argv[1:])
