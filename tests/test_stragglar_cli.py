"""``python -m collectives.stragglar``: the schedule and cost-model commands."""

import subprocess
import sys

import pytest

from collectives.stragglar import Schedule, generate, verify
from collectives.stragglar.__main__ import cost_table, schedule_text


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "collectives.stragglar", *args], capture_output=True, text=True, timeout=120
    )


def test_schedule_json_is_the_generated_schedule(tmp_path):
    out = _cli("schedule", "-n", "8", "--straggler", "2", "--json", "--plot", str(tmp_path / "s.png"))
    assert out.returncode == 0, out.stderr
    schedule = verify(Schedule.from_json(out.stdout))
    assert schedule == generate(8, 2)
    assert (tmp_path / "s.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_schedule_text_marks_the_straggler_exchanges():
    text = schedule_text(generate(4))
    lines = text.splitlines()
    assert lines[0].split() == ["round", "0", "1", "2", "3*"]
    # Round 0: rank 0 and the straggler reduce chunk 0; nobody else receives.
    assert lines[1].split() == ["0", "c0+", ".", ".", "c0+"]
    assert len(lines) == 1 + len(generate(4).rounds)
    out = _cli("schedule", "-n", "4")
    assert out.returncode == 0 and "lower bound 4 rounds; verified" in out.stdout


def test_cost_table_matches_the_formulas_and_the_paper_trend(tmp_path):
    rows = cost_table([4, 256], size=1 << 30, alpha=3e-6, beta=1 / (450 * (1 << 30)))
    (n4, r4, t4), (n256, r256, t256) = rows
    assert (r4, r256) == (4, 262)
    # StragglAR: R alpha + R/(n-1) s beta; Ring: 2(n-1) alpha + 2(n-1)/n s beta.
    assert t256["StragglAR"] == pytest.approx(262 * 3e-6 + 262 / 255 / 450)
    assert t256["Ring"] == pytest.approx(2 * 255 * 3e-6 + 2 * 255 / 256 / 450)
    # Figure 6b: the speedup over Ring grows with n and approaches 2x.
    assert 1.0 < t4["Ring"] / t4["StragglAR"] < t256["Ring"] / t256["StragglAR"] < 2.0
    out = _cli("cost", "--n", "4,8,16", "--plot", str(tmp_path / "c.png"))
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.splitlines()) == 2 + 3 + 1
    assert (tmp_path / "c.png").stat().st_size > 0


def test_bad_arguments_name_the_parameter():
    out = _cli("schedule", "-n", "1")
    assert out.returncode == 2 and "n" in out.stderr.splitlines()[-1]
    out = _cli("schedule", "-n", "8", "--straggler", "8")
    assert out.returncode == 2 and "straggler" in out.stderr


def test_plans_fills_the_plan_cache_once_and_refuses_bad_rank_counts(tmp_path, monkeypatch):
    from collectives.stragglar.plans import PLAN_CACHE_ENV, build_plan, load_plan

    monkeypatch.setenv(PLAN_CACHE_ENV, str(tmp_path))
    first = _cli("plans", "--n", "6,16")
    assert first.returncode == 0, first.stderr
    assert [line.split(":")[0] for line in first.stdout.splitlines()] == ["n=6", "n=16"]
    assert "generated and verified" in first.stdout
    for n in (6, 16):
        cached = load_plan(str(tmp_path), n)
        assert cached is not None and cached.digest == build_plan(n).digest
    again = _cli("plans", "--n", "16")
    assert again.returncode == 0 and "cached already" in again.stdout
    for bad in ("1,4", "x", ""):
        out = _cli("plans", "--n", bad)
        assert out.returncode == 2 and f"--n must be rank counts >= 2 separated by commas, got {bad!r}" in out.stderr
    monkeypatch.setenv(PLAN_CACHE_ENV, "off")
    off = _cli("plans", "--n", "8")
    assert off.returncode == 2 and "the plan cache is off" in off.stderr
