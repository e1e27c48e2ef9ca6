"""Logging: every line says whose rank it is, and a progress bar only where a terminal shows it."""

import contextlib
import fcntl
import io
import logging
import os
import struct
import subprocess
import sys
import termios
from pathlib import Path

from collectives.logs import RANK_VARIABLES
from experiments.progress import StepProgress

ROOT = Path(__file__).resolve().parent.parent
PROGRAM = (
    "import logging; from collectives.logs import configure_logging; configure_logging(); "
    "log = logging.getLogger('wagma.example'); log.info('started'); log.warning('slow'); log.debug('hidden')"
)


def _run(env):
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARIABLES} | env
    return subprocess.run(
        [sys.executable, "-c", PROGRAM], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=True
    )


def test_lines_carry_the_rank_the_launcher_gave():
    # Hydra (MPICH) sets PMI_RANK, Open MPI OMPI_COMM_WORLD_RANK, srun SLURM_PROCID. (PMIX_RANK alone, with
    # no PMIx server behind it, makes MPI's initialization in the program fail.)
    for variable in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"):
        done = _run({variable: "3"})
        assert done.stderr.splitlines() == [
            "[rank 3] wagma.example: started",
            "[rank 3] wagma.example: warning: slow",
        ], (variable, done.stderr)
        assert done.stdout == ""


def test_a_process_no_launcher_started_has_no_prefix():
    assert _run({}).stderr.splitlines() == ["wagma.example: started", "wagma.example: warning: slow"]


def _lines(total, start, stream):
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("experiments.progress")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        progress = StepProgress(total, start, enabled=True, stream=stream)
        for step in range(start + 1, total + 1):
            progress.update(step, loss=0.5, samples_per_second=100.0)
        progress.close()
    finally:
        logger.removeHandler(handler)
    return [record.getMessage() for record in records]


def test_off_a_terminal_one_line_per_tenth_and_no_carriage_return():
    stream = io.StringIO()
    lines = _lines(200, 0, stream)
    assert [line.split(" (")[0] for line in lines] == [f"step {s} of 200" for s in range(20, 201, 20)]
    assert "step 20 of 200 (10 %): loss 0.5000, 100 samples/s" == lines[0]
    assert stream.getvalue() == ""  # no bar was drawn
    # A resumed run reports from where it resumed.
    assert [line.split(" (")[0] for line in _lines(200, 130, io.StringIO())] == [
        f"step {s} of 200" for s in (140, 160, 180, 200)
    ]


def test_on_a_terminal_a_bar_and_no_lines():
    leader, follower = os.openpty()
    # A terminal 80 columns wide (a fresh pseudo-terminal has none, and tqdm draws nothing in them).
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    with os.fdopen(follower, "w") as terminal:
        assert _lines(50, 0, terminal) == []
    os.set_blocking(leader, False)
    drawn = b""
    with contextlib.suppress(BlockingIOError, OSError):  # EAGAIN (or EIO) once all is read
        while chunk := os.read(leader, 1 << 16):
            drawn += chunk
    os.close(leader)
    drawn = drawn.decode(errors="replace")
    assert "50/50" in drawn and "\r" in drawn


def test_disabled_reports_nothing():
    stream = io.StringIO()
    progress = StepProgress(10, 0, enabled=False, stream=stream)
    for step in range(1, 11):
        progress.update(step, 0.1, 1.0)
    progress.close()
    assert stream.getvalue() == ""
