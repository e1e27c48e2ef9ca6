"""The checkpoint's members: which rows resume, after ranks died without fault tolerance.

Real folders and the real command (``python -m experiments.checkpoint``),
as ``slurm/train-job.sh`` runs it between a failed launch and the relaunch.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from experiments.checkpoint import Latest, checkpoint_path, drop_members, read_latest

ROOT = Path(__file__).resolve().parent.parent


def _command(*args):
    return subprocess.run(
        [sys.executable, "-m", "experiments.checkpoint", *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _saved(directory, step, members, rows):
    """A checkpoint folder as save_checkpoint leaves it: a file per member, then the record."""
    directory.mkdir(parents=True, exist_ok=True)
    for row in members:
        torch.save({"step": step}, checkpoint_path(directory, row, step))
    Latest(step, list(members), rows).write(directory)


def test_the_dead_ranks_leave_the_members_and_the_relaunch_is_told_how_many_are_left(tmp_path):
    _saved(tmp_path, 40, range(8), 8)
    done = _command("without", tmp_path, "--of", 8, "--died-at", 1700000000.5, 5, 2)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "6"
    meta = json.loads((tmp_path / "latest.json").read_text())
    assert meta == {
        "step": 40,
        "ranks": 6,
        "rows": 8,
        "members": [0, 1, 3, 4, 6, 7],
        "left": [{"row": 2, "died_at": 1700000000.5}, {"row": 5, "died_at": 1700000000.5}],
    }
    # Rank 4 of the relaunched job is row 6: it finds that row's file.
    assert read_latest(tmp_path, 4, 6).members[4] == 6
    assert _command("ranks", tmp_path, "--default", 8).stdout.strip() == "6"


def test_a_second_death_is_numbered_in_the_relaunched_job(tmp_path):
    """The relaunch's rank 3 is row 4 once row 2 has left: a death of rank 3 then takes row 4 out."""
    _saved(tmp_path, 40, range(6), 6)
    drop_members(tmp_path, [2], 6, died_at=1.0)
    latest = drop_members(tmp_path, [3], 5, died_at=2.0)
    assert latest.members == [0, 1, 3, 5]
    assert latest.left == [{"row": 2, "died_at": 1.0}, {"row": 4, "died_at": 2.0}]


def test_a_death_before_the_first_checkpoint_resumes_from_the_seeded_start(tmp_path):
    directory = tmp_path / "ckpt"
    done = _command("without", directory, "--of", 4, 0)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "3"
    latest = Latest.read(directory)
    assert (latest.step, latest.members, latest.rows) == (0, [1, 2, 3], 4)
    assert latest.left == [{"row": 0, "died_at": None}]
    # Step 0 names no files: every rank of the three finds what it needs.
    assert [read_latest(directory, r, 3).step for r in range(3)] == [0, 0, 0]
    assert _command("ranks", tmp_path / "nothing-here", "--default", 4).stdout.strip() == "4"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--of", 6, 1], "{folder} holds a checkpoint of 8 ranks, not of the job's 6"),
        (["--of", 8, 8], "the dead ranks must be ranks of the job, 0 .. 7; got [8]"),
        (["--of", 8, -1], "the dead ranks must be ranks of the job, 0 .. 7; got [-1]"),
        (["--of", 8, *range(8)], "no rank of the job's 8 is left to resume on"),
    ],
)
def test_a_dead_rank_list_that_does_not_fit_the_checkpoint_is_refused_and_changes_nothing(tmp_path, args, message):
    _saved(tmp_path, 40, range(8), 8)
    before = (tmp_path / "latest.json").read_text()
    done = _command("without", tmp_path, *args)
    assert done.returncode == 2
    assert done.stderr.strip() == f"experiments.checkpoint: error: {message.format(folder=tmp_path)}"
    assert (tmp_path / "latest.json").read_text() == before


def test_a_resume_on_another_rank_count_or_without_its_file_is_refused_by_name(tmp_path):
    _saved(tmp_path, 40, [0, 1, 3], 4)
    wrong_count = (
        rf"^--checkpoint-dir {tmp_path} holds a checkpoint of 3 ranks; this run has 4 \(resume with 3 ranks\)$"
    )
    with pytest.raises(ValueError, match=wrong_count):
        read_latest(tmp_path, 0, 4)
    Path(checkpoint_path(tmp_path, 3, 40)).unlink()
    with pytest.raises(ValueError, match=rf"^--checkpoint-dir {tmp_path}: row 3's file of step 40 is missing$"):
        read_latest(tmp_path, 2, 3)
    assert read_latest(tmp_path, 1, 3).members == [0, 1, 3]


def test_a_record_written_before_members_were_kept_reads_as_every_rank_its_own_row(tmp_path):
    (tmp_path / "latest.json").write_text(json.dumps({"step": 10, "ranks": 4}))
    latest = Latest.read(tmp_path)
    assert (latest.step, latest.members, latest.rows, latest.left) == (10, [0, 1, 2, 3], 4, [])
