"""``experiments.emulate --replay``: a measured ``experiments.train`` run, replayed in one
process from its run file, gives the models its ranks saved at the end.

A real 4-rank WAGMA-SGD job with a random rank made late each step, so that
some versions begin without it, and an AD-PSGD one; each replay is checked against the job's final
checkpoints (every algorithm's replay, at 2, 4 and 8 ranks, is in
tests/test_emulate_mpi.py; this is the command line's path: the run's own
command line rebuilt from its file, the task built as experiments.train builds it).
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import pytest
from launcher import mpiexec, mpiexec_command

from experiments.emulate import main as emulate_main
from wagma.results import load_run

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.driver, pytest.mark.skipif(mpiexec() is None, reason="no mpiexec found")]


def _train(folder, algo):
    """A finished 4-rank run of ``algo``, a random rank 20 ms late each step: its file and
    its checkpoint folder."""
    out, checkpoints = folder / "run.h5", folder / "checkpoints"
    job = subprocess.run(
        [
            *mpiexec_command(4),
            sys.executable,
            "-m",
            "experiments.train",
            "--algo",
            algo,
            "--epochs",
            "1",
            "--max-steps",
            "16",
            "--eval-every",
            "0",
            "--imbalance",
            "random:k=1,ms=20",
            "--checkpoint-dir",
            str(checkpoints),
            "--out",
            str(out),
            "--no-progress",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert job.returncode == 0, job.stderr[-3000:]
    return out, checkpoints


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    return _train(tmp_path_factory.mktemp("measured"), "wagma")


@pytest.mark.timing  # that some version began without the late rank: scheduling decides
def test_a_replayed_run_gives_its_ranks_models_bitwise(measured, tmp_path, capsys):
    run, checkpoints = measured
    replay = tmp_path / "replay.h5"
    assert (
        emulate_main(["--replay", str(run), "--checkpoints", str(checkpoints), "--out", str(replay), "--no-progress"])
        == 0
    )
    assert "bitwise equal" in capsys.readouterr().out
    logged, replayed = load_run(str(run)), load_run(str(replay))
    assert logged.steps["stale"].any(), "no contribution was stale: the replay did not test the order"
    assert replayed.attrs["kind"] == "emulated" and replayed.attrs["schedule"] == f"logged: {run}"
    assert (replayed.steps["stale"] == logged.steps["stale"]).all()
    assert (replayed.steps["clock"] == logged.steps["clock"]).all()  # the run's times


def test_an_adpsgd_run_replayed_from_its_exchange_log_gives_its_ranks_models_bitwise(tmp_path, capsys):
    # The final checkpoint is written after close(), where the last exchanges land.
    run, checkpoints = _train(tmp_path, "adpsgd")
    assert (
        emulate_main(
            [
                "--replay",
                str(run),
                "--checkpoints",
                str(checkpoints),
                "--out",
                str(tmp_path / "replay.h5"),
                "--no-progress",
            ]
        )
        == 0
    )
    assert "bitwise equal" in capsys.readouterr().out
    exchanges = load_run(str(run)).tables["exchanges"]
    assert sorted(set(exchanges[:, 0])) == [0, 1, 2, 3] and (exchanges[:, 2] == (exchanges[:, 0] % 2 == 0)).all()


def test_a_replay_in_another_order_differs(measured, tmp_path, capsys):
    """The check can fail: the run replayed as if every rank had been fresh
    (its logged contributions replaced by the step itself) does not give its models."""
    run, checkpoints = measured
    altered = tmp_path / "altered.h5"
    shutil.copy(run, altered)
    with h5py.File(altered, "a") as f:
        contribution = f["steps"]["contribution"]
        assert (contribution[()] != range(contribution.shape[1])).any()
        contribution[...] = [list(range(contribution.shape[1]))] * contribution.shape[0]
    assert (
        emulate_main(
            [
                "--replay",
                str(altered),
                "--checkpoints",
                str(checkpoints),
                "--out",
                str(tmp_path / "replay.h5"),
                "--no-progress",
            ]
        )
        == 1
    )
    assert "differs" in capsys.readouterr().out


def test_bad_command_lines_are_refused_before_anything_runs(tmp_path, capsys):
    cases = {
        ("--ranks", "8"): "--algo is required",
        ("--algo", "wagma", "--ranks", "0"): "--ranks must be >= 1, got 0",
        ("--replay", str(tmp_path / "none.h5")): "no such file",
        ("--algo", "wagma", "--checkpoints", "x"): "--checkpoints goes with --replay",
        ("--algo", "wagma", "--compute", "emulate"): "--compute emulate has no gradients",
        ("--algo", "wagma", "--group-size", "0"): "--group-size must be an int from 1 to",
    }
    for argv, message in cases.items():
        assert emulate_main(list(argv)) == 2, argv
        assert message in capsys.readouterr().err, argv


def test_runs_it_cannot_replay_are_refused_with_the_reason(measured, tmp_path, capsys):
    run, _ = measured
    for change, message in (
        (lambda c: c.pop("algo"), "not a run of experiments.train"),
        (lambda c: c.update(fault=["kill:rank=1,step=3"]), "faults injected"),
        (lambda c: c.update(compute="emulate"), "no gradients to replay"),
    ):
        altered = tmp_path / "altered.h5"
        shutil.copy(run, altered)
        with h5py.File(altered, "a") as f:
            config = json.loads(f.attrs["config"])
            change(config)
            f.attrs["config"] = json.dumps(config)
        assert emulate_main(["--replay", str(altered), "--no-progress"]) == 2
        assert message in capsys.readouterr().err
