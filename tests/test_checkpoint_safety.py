"""Checkpoints that cannot run code: a resume reads tensors and plain data only.

A checkpoint directory on a cluster's shared scratch can be written by
others.  A real 2-rank job writes its checkpoints; one rank's file is then
replaced by a pickle that would create a file when unpickled, and the
resumed job must refuse it on every rank, naming it, without building it.
"""

import pathlib
import subprocess
import sys

import pytest
import torch
from launcher import mpiexec, mpiexec_command

from experiments.checkpoint import read_state
from wagma.results import load_run

ROOT = pathlib.Path(__file__).resolve().parent.parent
COMMAND = [
    "--algo",
    "local_sgd",
    "--dataset",
    "digits",
    "--epochs",
    "1",
    "--max-steps",
    "4",
    "--eval-every",
    "0",
    "--no-progress",
]


class _RunsCode:
    """Unpickled, it creates ``marker``: what a hostile checkpoint would do in place of ``touch``."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (pathlib.Path(self.marker),))


def _hostile_copy(path, marker):
    """Rewrite checkpoint ``path`` with its own state plus an object that runs code when unpickled."""
    state = read_state(path)
    state["note"] = _RunsCode(marker)
    torch.save(state, path)


def test_reading_a_checkpoint_that_would_run_code_refuses_it_by_name(tmp_path):
    path, marker = tmp_path / "rank00000.step000000004.pt", tmp_path / "ran"
    torch.save({"model": {"w": torch.ones(2)}, "step": 4}, path)
    assert read_state(path)["step"] == 4
    _hostile_copy(path, marker)
    with pytest.raises(ValueError, match=f"{path} holds more than tensors and plain data \\(getattr\\)"):
        read_state(path)
    assert not marker.exists()
    torch.load(path, weights_only=False)  # the same file, read as before: it runs the code
    assert marker.exists()


@pytest.mark.driver
@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec found")
def test_a_resume_refuses_a_checkpoint_that_would_run_code_on_every_rank(tmp_path):
    checkpoints, marker = tmp_path / "ck", tmp_path / "ran"
    run = [
        *mpiexec_command(2),
        sys.executable,
        "-m",
        "experiments.train",
        *COMMAND,
        "--out",
        str(tmp_path / "r.h5"),
        "--checkpoint-dir",
        str(checkpoints),
    ]
    first = subprocess.run(run, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    hostile = checkpoints / "rank00001.step000000004.pt"
    _hostile_copy(hostile, marker)
    resumed = subprocess.run(
        [*run, "--resume", "--max-steps", "8"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert resumed.returncode != 0
    assert not marker.exists()
    # Every rank raises this error (collectives.agreement), naming rank 1's file; whether each
    # rank's copy is printed before the first abort ends the job is the scheduler's choice.
    assert f"--resume: rank 1: {hostile} holds more than tensors and plain data (getattr)" in resumed.stderr
    # The run file keeps the 4 steps of the first job.
    assert load_run(str(tmp_path / "r.h5")).steps["clock"].shape == (2, 4)


def test_a_file_that_is_no_checkpoint_is_named_whatever_torch_raises(tmp_path):
    good = tmp_path / "good.pt"
    torch.save({"model": {"w": torch.ones(3)}, "step": 1}, good)
    whole = good.read_bytes()
    for name, data in {
        "text.pt": b"not a checkpoint at all\n",
        "empty.pt": b"",
        "cut.pt": whole[: len(whole) // 2],
    }.items():
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(ValueError, match=f"{path} is not a readable checkpoint: [A-Za-z]+Error"):
            read_state(path)
    with pytest.raises(ValueError, match="is not a readable checkpoint: FileNotFoundError"):
        read_state(tmp_path / "missing.pt")
