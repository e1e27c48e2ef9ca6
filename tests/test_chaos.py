"""The chaos plan (wagma.chaos): specs checked with the flag's name, failures drawn from the seed alone."""

import json
import signal
import subprocess
import sys
import time

import pytest

from wagma.chaos import CHAOS_KINDS, ChaosMonkey, parse_chaos


def test_a_spec_names_mtbf_kinds_seed_hang_and_keep():
    plan = parse_chaos("mtbf=12.5,kinds=sigkill+stop,seed=7,hang=3,keep=2", 8, 0)
    assert (plan.mtbf, plan.kinds, plan.seed, plan.hang, plan.keep, plan.rows) == (
        12.5,
        ("sigkill", "stop"),
        7,
        3.0,
        2,
        8,
    )
    default = parse_chaos("mtbf=10", 8, 5)
    assert default.kinds == CHAOS_KINDS and default.seed == 5 and default.hang == 5.0 and default.keep == 1


@pytest.mark.parametrize(
    "spec, why",
    [
        ("", "is not NAME=VALUE"),
        ("kinds=sigkill", "mtbf (the mean seconds between failures) is required"),
        ("mtbf=ten", "mtbf must be a number of seconds, got 'ten'"),
        ("mtbf=-1", "mtbf must be above zero, got '-1'"),
        ("mtbf=inf", "mtbf must be above zero, got 'inf'"),
        ("mtbf=10,mtbf=20", "mtbf is given twice"),
        ("mtbf=10,rate=2", "'rate=2' is not NAME=VALUE with NAME one of mtbf, kinds, seed, hang, keep"),
        ("mtbf=10,kinds=sigkill+sigkill", "kinds must be distinct names of"),
        ("mtbf=10,kinds=oom", "kinds must be distinct names of sigkill, sigsegv, exit, stop, hang joined by +"),
        ("mtbf=10,seed=x", "seed must be an integer, got 'x'"),
        ("mtbf=10,hang=0", "hang must be above zero"),
        ("mtbf=10,keep=8", "keep must be in [1, 7] (this run has 8 ranks), got 8"),
        ("mtbf=10,keep=0", "keep must be in [1, 7]"),
    ],
)
def test_refused_specs_name_the_flag_the_problem_and_the_form(spec, why):
    with pytest.raises(ValueError) as error:
        parse_chaos(spec, 8, 0)
    message = str(error.value)
    assert message.startswith(f"--chaos {spec!r}: ") and why in message and "accepted form: mtbf=SEC" in message


def test_the_failures_are_the_seeds_alone_and_spread_as_the_mtbf_says():
    plan = parse_chaos("mtbf=20,seed=3", 8, 0)
    events = plan.events(4000)
    assert events == parse_chaos("mtbf=20,seed=3", 8, 99).events(4000)  # the spec's seed, not the run's
    assert events[:10] == plan.events(10)  # a longer plan begins with the shorter one
    assert events != parse_chaos("mtbf=20,seed=4", 8, 0).events(4000)
    times = [t for t, _, _ in events]
    gaps = [b - a for a, b in zip([0.0, *times], times)]
    # Exponential gaps of mean 20 s: the mean of 4000 is within 5 % of it (its standard error is 1.6 %).
    assert sum(gaps) / len(gaps) == pytest.approx(20, rel=0.05)
    rows = [r for _, r, _ in events]
    kinds = [k for _, _, k in events]
    # Uniform rows and kinds: each of 8 rows 500 expected (sd 21), each of 5 kinds 800 (sd 25); 5 sd off is a defect.
    assert all(abs(rows.count(r) - 500) < 110 for r in range(8))
    assert all(abs(kinds.count(k) - 800) < 130 for k in CHAOS_KINDS)


def test_the_record_holds_the_plan_and_its_events():
    plan = parse_chaos("mtbf=5,kinds=exit,seed=1", 4, 0)
    record = json.loads(plan.record())
    assert record["mtbf"] == 5 and record["kinds"] == ["exit"] and record["rows"] == 4
    assert [tuple(e) for e in record["events"][:3]] == [tuple(e) for e in plan.events(3)]


_VICTIM = """
import sys, time, torch
from wagma.chaos import ChaosMonkey, parse_chaos
kind, start = sys.argv[1], float(sys.argv[2])
plan = parse_chaos(f"mtbf=0.3,kinds={kind},seed=2,hang=0.5", 2, 0)
row = next(r for _, r, _ in plan.stream())  # the first failure's row
model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
ChaosMonkey(plan, row, lambda: 2).start(optimizer, start)
while True:  # a training loop: the failure strikes it wherever it is
    model(torch.ones(2)).sum().backward()
    optimizer.step()
    time.sleep(0.01)
"""


@pytest.mark.parametrize(
    "kind, status",
    [
        ("sigkill", -signal.SIGKILL),
        ("sigsegv", -signal.SIGSEGV),
        ("exit", 0),
        ("stop", -signal.SIGKILL),  # stopped, then fenced after hang seconds
        ("hang", -signal.SIGKILL),  # stuck in its update, then fenced after hang seconds
    ],
)
def test_each_kind_ends_a_training_process_as_it_says(kind, status):
    """A real process, a real signal: the first failure of the plan strikes
    the row it names, and the process ends the way the kind says."""
    started = time.time()
    victim = subprocess.run([sys.executable, "-c", _VICTIM, kind, str(started)], timeout=60, capture_output=True)
    assert victim.returncode == status, victim.stderr[-2000:]
    first = parse_chaos("mtbf=0.3,seed=2", 2, 0).events(1)[0][0]
    assert time.time() - started >= first + (0.5 if kind in ("stop", "hang") else 0)


def test_no_failure_strikes_the_last_members_it_keeps():
    import torch

    plan = parse_chaos("mtbf=0.05,kinds=sigkill,seed=2,keep=2", 3, 0)
    row = next(r for _, r, _ in plan.stream())
    monkey = ChaosMonkey(plan, row, lambda: 2)  # only keep members left
    monkey.start(torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1), time.time())
    deadline = time.monotonic() + 30
    while monkey.spared < 3 and time.monotonic() < deadline:  # a strike would have ended this process
        time.sleep(0.01)
    monkey.stop()
    assert monkey.spared >= 3
