"""``experiments.campaign main`` as a user runs it: its own fresh folder, commands that paste, nothing else touched."""

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.options import build_parser
from launcher import mpiexec, mpiexec_command
from wagma.results import load_run

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.launcher
@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec next to this Python or on PATH")
def test_main_campaign_writes_a_fresh_folder_under_runs_and_prints_pasteable_commands(tmp_path):
    """Run from an empty working directory, as a fresh clone's `make main` would
    be: everything it writes lands in runs/main-TIMESTAMP (git-ignored) there, and
    each job's printed command line names an existing launcher and interpreter and
    parses back to the options the job ran with."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPIEXEC": mpiexec()}
    job = subprocess.run([sys.executable, "-m", "experiments.campaign", "main", "--ranks", "2", "--epochs", "1",
                          "--algos", "local_sgd"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert job.returncode == 0, job.stderr
    (out_dir,) = (tmp_path / "runs").iterdir()
    assert out_dir.name.startswith("main-")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]      # nothing outside runs/
    written = sorted(p.name for p in out_dir.iterdir())
    assert written == ["accuracy_vs_time.png", "local_sgd_p2.h5", "table.md", "throughput.png",
                       "waits_local_sgd_p2.png"], written
    assert load_run(str(out_dir / "local_sgd_p2.h5")).attrs["status"] == "complete"
    assert job.stdout.rstrip().endswith(f"to {os.path.join('runs', out_dir.name)}")
    (shown,) = [line[2:] for line in job.stdout.splitlines() if line.startswith("$ ")]
    words = shlex.split(shown)
    launch = mpiexec_command(2)                 # with the flags its library needs
    assert words[:len(launch)] == launch and os.access(words[0], os.X_OK)
    words = words[len(launch):]
    assert words[0] == sys.executable and words[1:3] == ["-m", "experiments.train"]
    args = build_parser().parse_args(words[3:])
    assert (args.algo, args.epochs, args.out) == ("local_sgd", 1, os.path.join("runs", out_dir.name,
                                                                               "local_sgd_p2.h5"))
