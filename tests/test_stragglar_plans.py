"""StragglAR plans: one verified schedule per n, relabelled per straggler, cached and received by digest."""

import logging

import numpy as np
import pytest

from collectives.schedules.partition import block_offsets
from collectives.stragglar import generate, verify
from collectives.stragglar.plans import (
    PLAN_CACHE_ENV,
    CanonicalPlan,
    build_plan,
    load_plan,
    plan_cache_dir,
    rank_steps,
    received_plan,
    store_plan,
)
from collectives.stragglar.runtime import _my_steps


@pytest.mark.parametrize("n", [2, 3, 8, 9, 64, 100])
def test_every_ranks_steps_are_those_of_the_schedule_generated_for_its_straggler(n):
    """The relabelled plan is, transfer for transfer, the generator's
    schedule for each straggler, and each rank reads the same part of it."""
    plan = build_plan(n)
    chunks = block_offsets(1001, n - 1)
    for straggler in sorted({0, 1, n // 2, n - 1}):
        schedule = verify(generate(n, straggler))
        assert plan.schedule(straggler) == schedule
        for rank in range(n):
            assert rank_steps(plan, straggler, rank, chunks) == _my_steps(schedule, rank, chunks)


def _damaged(plan):
    """``plan`` with one transfer's chunk changed and the digest it had."""
    transfers = plan.transfers.copy()
    transfers[len(transfers) // 2, 2] ^= 1
    return CanonicalPlan(plan.n, transfers, plan.round_starts, plan.digest)


def test_a_cached_plan_is_read_back_and_a_damaged_one_is_refused(tmp_path, caplog):
    plan = build_plan(12)
    store_plan(str(tmp_path), plan)
    back = load_plan(str(tmp_path), 12)
    assert back is not None and back.digest == plan.digest and back.intact()
    np.testing.assert_array_equal(back.transfers, plan.transfers)
    assert load_plan(str(tmp_path), 13) is None  # none cached: built, nothing to warn of

    store_plan(str(tmp_path), _damaged(plan))  # altered, its old digest kept
    with caplog.at_level(logging.WARNING):
        assert load_plan(str(tmp_path), 12) is None
    assert "does not match its digest" in caplog.text

    path = tmp_path / "plan-n12.npz"
    path.write_bytes(path.read_bytes()[:100])  # torn
    with caplog.at_level(logging.WARNING):
        assert load_plan(str(tmp_path), 12) is None
    assert "unreadable" in caplog.text


def test_a_received_plan_that_does_not_match_its_digest_is_rebuilt(caplog):
    plan = build_plan(10)
    damaged = _damaged(plan)
    with caplog.at_level(logging.WARNING):
        used = received_plan(10, damaged.digest, damaged.transfers, damaged.round_starts)
    assert "does not match its digest" in caplog.text
    assert used.intact() and used.digest == plan.digest
    np.testing.assert_array_equal(used.transfers, plan.transfers)
    kept = received_plan(10, plan.digest, plan.transfers, plan.round_starts)
    assert kept.transfers is plan.transfers  # an intact one is used as it came


def test_the_plan_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(PLAN_CACHE_ENV, "off")
    assert plan_cache_dir() is None
    monkeypatch.setenv(PLAN_CACHE_ENV, str(tmp_path))
    assert plan_cache_dir() == str(tmp_path)
    monkeypatch.delenv(PLAN_CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert plan_cache_dir() == str(tmp_path / "collectives" / "stragglar")
