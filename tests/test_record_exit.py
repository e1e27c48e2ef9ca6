"""slurm/record-exit.sh, which each rank of a Slurm job runs under: how the rank ended, and the signals it passes on.

Real processes and real signals: the wrapper runs a Python child that
writes a marker once its handlers are set, and the test signals the
wrapper (as Slurm signals a task) or the child (as a fault kills a rank).
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.timing  # real signals to real processes

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "slurm" / "record-exit.sh"
DEADLINE = 30

# The child: exits 75 on SIGUSR1 (a checkpoint before the time limit), 143 on SIGTERM; says it is ready.
CHILD = """
import os, signal, sys, time
signal.signal(signal.SIGUSR1, lambda *_: sys.exit(75))
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
open(sys.argv[1], "w").write(str(os.getpid()))
while True:
    time.sleep(1)
"""


def _start(tmp_path, rank=2):
    ledger, ready = tmp_path / "ledger", tmp_path / f"ready-{rank}"
    wrapper = subprocess.Popen(
        ["bash", str(SCRIPT), str(ledger), sys.executable, "-c", CHILD, str(ready)],
        env={k: v for k, v in os.environ.items() if k not in ("OMPI_COMM_WORLD_RANK", "PMI_RANK")}
        | {"SLURM_PROCID": str(rank)},
        cwd=ROOT,
    )
    start = time.monotonic()
    while not ready.exists() or not ready.read_text():
        assert wrapper.poll() is None, "the wrapper ended before its child was ready"
        assert time.monotonic() - start < DEADLINE, "the child never became ready"
        time.sleep(0.02)
    return wrapper, int(ready.read_text()), ledger


def _record(ledger, rank):
    code, when = (ledger / f"rank-{rank}").read_text().split()
    return int(code), float(when)


def test_a_rank_killed_by_a_signal_is_recorded_with_its_status_and_time(tmp_path):
    wrapper, child, ledger = _start(tmp_path)
    before = time.time()
    os.kill(child, signal.SIGKILL)
    assert wrapper.wait(timeout=DEADLINE) == -signal.SIGKILL  # it ends as its rank did
    code, when = _record(ledger, 2)
    assert code == 128 + signal.SIGKILL and before <= when <= time.time()


def test_the_time_limit_warning_reaches_the_rank_and_its_own_exit_status_is_recorded(tmp_path):
    wrapper, _, ledger = _start(tmp_path)
    wrapper.send_signal(signal.SIGUSR1)
    assert wrapper.wait(timeout=DEADLINE) == 75
    assert _record(ledger, 2)[0] == 75


def test_a_sigterm_with_no_rank_dead_is_passed_on(tmp_path):
    """Preemption or scancel: the rank gets the SIGTERM (and may checkpoint)."""
    wrapper, _, ledger = _start(tmp_path)
    wrapper.send_signal(signal.SIGTERM)
    # The rank's status, 143, reads as SIGTERM's (bash cannot tell them apart): recorded, and ended so.
    assert wrapper.wait(timeout=DEADLINE) == -signal.SIGTERM
    assert _record(ledger, 2)[0] == 128 + signal.SIGTERM


def test_a_sigterm_after_another_rank_died_kills_the_rank_at_once_and_records_no_death(tmp_path):
    """srun ending the step after rank 3 died: this rank, blocked on the dead one, goes at once."""
    wrapper, child, ledger = _start(tmp_path)
    ledger.mkdir()
    (ledger / "rank-3").write_text(f"{128 + signal.SIGSEGV} {time.time()}\n")
    wrapper.send_signal(signal.SIGTERM)
    assert wrapper.wait(timeout=DEADLINE) == -signal.SIGKILL
    assert not (ledger / "rank-2").exists()
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)


def test_the_rank_goes_with_its_wrapper(tmp_path):
    wrapper, child, _ = _start(tmp_path)
    wrapper.kill()
    wrapper.wait(timeout=DEADLINE)
    start = time.monotonic()
    while Path(f"/proc/{child}").exists() and "Z" not in _state(child):
        assert time.monotonic() - start < DEADLINE, "the rank outlived its wrapper"
        time.sleep(0.02)


def _state(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "Z"
