"""Fault specs (wagma.faults): what --fault accepts, and what it refuses before any message."""

import signal
import subprocess
import time

import pytest

from wagma.faults import Fault, FaultInjector, parse_fault, parse_faults, signal_after_stop


@pytest.mark.parametrize(
    "spec, fault",
    [
        ("slow:rank=1,steps=5-15,ms=500", Fault("slow", 1, 5, 15, 0.5)),
        ("slow:rank=0,steps=7,ms=20", Fault("slow", 0, 7, 7, 0.02)),
        ("stop:rank=3,step=40,seconds=6", Fault("stop", 3, 40, 40, 6.0)),
        ("kill:rank=2,step=99", Fault("kill", 2, 99, 99, 0.0)),
        ("kill:rank=2,step=100", Fault("kill", 2, 100, 100, 0.0)),  # during the final evaluation
        ("kill:rank=0,step=3,how=sigsegv", Fault("kill", 0, 3, 3, 0.0, "sigsegv")),
        ("kill:rank=1,step=3,how=exit", Fault("kill", 1, 3, 3, 0.0, "exit")),
    ],
)
def test_accepted_specs(spec, fault):
    assert parse_fault(spec, 4, 100) == fault


@pytest.mark.parametrize(
    "spec, why",
    [
        ("hang:rank=0,step=1", "unknown kind 'hang'"),
        ("kill:rank=4,step=1", r"rank must be an integer in \[0, 3\] \(the ranks of this run\), got '4'"),
        ("kill:rank=-1,step=1", r"rank must be an integer in \[0, 3\]"),
        ("stop:rank=0,step=100,seconds=1", r"steps must lie in \[0, 99\] \(this run has 100 steps\), got 100"),
        ("slow:rank=0,steps=9-3,ms=5", r"steps must lie in \[0, 99\]"),
        ("kill:rank=0,step=101", r"steps must lie in \[0, 100\] \(this run has 100 steps; a kill at step 100 strikes"),
        ("kill:rank=0,step=100,how=exit", r"steps must lie in \[0, 99\]"),  # exit leaves from inside a step
        ("stop:rank=0,step=1-3,seconds=1", "step must be an integer"),
        ("stop:rank=0,step=1,seconds=0", "the duration must be above zero"),
        ("slow:rank=0,steps=1-2,ms=-5", "the duration must be above zero"),
        ("stop:rank=0,step=1,seconds=soon", "the duration must be a number"),
        ("kill:rank=0,step=1,seconds=2", "kill takes exactly the fields rank, step"),
        ("slow:rank=0,ms=5", "slow takes exactly the fields rank, steps, ms"),
        ("kill:rank=0,step=1,how=sigterm", "how must be one of sigkill, sigsegv, exit, got 'sigterm'"),
        ("stop:rank=0,step=1,seconds=1,how=exit", "stop takes exactly the fields rank, step, seconds"),
    ],
)
def test_refused_specs_name_the_option_the_problem_and_the_forms(spec, why):
    with pytest.raises(ValueError, match=rf"--fault '{spec}': {why}.*; accepted forms: slow:rank=R"):
        parse_fault(spec, 4, 100)


def test_a_slow_fault_sleeps_on_its_rank_and_steps_only():
    faults = parse_faults(["slow:rank=1,steps=2-3,ms=30"], 2, 10)
    mine, other = FaultInjector(faults, 1), FaultInjector(faults, 0)
    assert [mine.before_step(s) for s in range(5)] == [0.0, 0.0, 0.03, 0.03, 0.0]
    assert [other.before_step(s) for s in range(5)] == [0.0] * 5
    assert parse_faults(None, 2, 10) == []


def test_fault_tolerance_is_read_from_open_mpis_ulfm_switch():
    from collectives.failures import fault_tolerant

    assert fault_tolerant({"OMPI_MCA_mpi_ft_enable": "1"}) and fault_tolerant({"OMPI_MCA_mpi_ft_enable": "true"})
    assert not fault_tolerant({}) and not fault_tolerant({"OMPI_MCA_mpi_ft_enable": "0"})


def _state(pid):
    with open(f"/proc/{pid}/status") as status:
        return next(line.split()[1] for line in status if line.startswith("State:"))


def test_the_stop_helper_continues_the_process_once_it_has_stopped_for_the_seconds():
    target = subprocess.Popen(["sleep", "60"])
    try:
        helper = signal_after_stop(target.pid, 0.2, signal.SIGCONT)
        stopped = time.monotonic()
        target.send_signal(signal.SIGSTOP)
        assert helper.wait(timeout=30) == 0  # it sent SIGCONT
        assert time.monotonic() - stopped >= 0.2
        assert _state(target.pid) != "T"
    finally:
        target.kill()
        target.wait()


def test_the_fencing_helper_kills_the_process_once_it_has_stopped_for_the_seconds():
    """Chaos's ``stop``: a stopped process is killed after the seconds, not continued."""
    target = subprocess.Popen(["sleep", "60"])
    try:
        helper = signal_after_stop(target.pid, 0.2, signal.SIGKILL)
        stopped = time.monotonic()
        target.send_signal(signal.SIGSTOP)
        assert target.wait(timeout=30) == -signal.SIGKILL
        assert time.monotonic() - stopped >= 0.2 and helper.wait(timeout=30) == 0
    finally:
        target.kill()
        target.wait()


def test_the_stop_helper_ends_when_its_process_is_gone_before_it_stopped():
    """A rank killed between starting the helper and its SIGSTOP (its job
    ended) must not leave the helper polling for it for ever."""
    target = subprocess.Popen(["sleep", "60"])
    helper = signal_after_stop(target.pid, 0.2, signal.SIGCONT)
    target.kill()
    target.wait()  # reaped: /proc/PID is gone
    try:
        assert helper.wait(timeout=30) == 0
    finally:
        helper.kill()
        helper.wait()
