"""The wait-avoiding group allreduce and eager-SGD's partial collectives, under mpiexec.

Contributions are integers that name their rank and iteration,
``value(rank, t) = rank * 10**6 + t + 1`` (plus the element index), so every
group sum can be checked exactly against the contributions its members
actually used, which each rank's ``history`` records.
"""

import threading
import time

import numpy as np
import pytest
from mpi4py import MPI

from collectives import (
    WaitAvoidingGroupAllreduce,
    butterfly_groups,
    majority_allreduce,
    solo_allreduce,
)

pytestmark = pytest.mark.mpi

WORLD = MPI.COMM_WORLD
P = WORLD.size
POW2 = P & (P - 1) == 0
needs_pow2 = pytest.mark.skipif(not POW2, reason="butterfly groups need a power-of-two world")
NUMEL = 33
ITERATIONS = 520


def value(rank, t):
    return rank * 10**6 + t + 1 + np.arange(NUMEL, dtype=np.int64)


def _delays(kind, seed=7):
    """Per-iteration sleep of this rank, in seconds."""
    rng = np.random.default_rng([seed, WORLD.rank])
    if kind == "random":
        return rng.random(ITERATIONS) * 2e-3 + (rng.random(ITERATIONS) < 0.05) * 1e-2
    slow = WORLD.rank == P - 1
    return np.full(ITERATIONS, 5e-3 if slow else 0.0)


def _run(wa, delays):
    """Drive ``wa`` for ITERATIONS steps; returns the per-step records.

    Every contribution is a new buffer, lent to the collective; the results
    are kept as they came (the caller owns them).  A lent buffer must still
    hold what it held after the call (its contribution, plus with
    ``carry_over`` the one it carried) when the next one replaces it: while
    published it is only read.
    """
    records, lent, reference = [], None, WORLD.Dup()
    with wa:
        start = time.perf_counter()
        for t in range(ITERATIONS):
            time.sleep(delays[t])
            if lent is not None:
                np.testing.assert_array_equal(lent[1], lent[2],
                                              err_msg=f"the buffer lent at {lent[0]} was written")
            contribution = value(WORLD.rank, t)
            if wa.is_group_version(t):
                result = wa.allreduce(contribution, t)
                assert result.version == t
                assert result.value is not contribution
                lent = (t, contribution, contribution.copy())
                records.append((t, result.fresh, result.contribution_iteration,
                                result.value))
            else:
                expected = np.empty_like(contribution)
                reference.Allreduce(contribution, expected)
                wa.sync_allreduce(contribution, t)   # publishes a copy
                lent = None
                np.testing.assert_array_equal(contribution, expected)
                records.append((t, None, None, contribution.copy()))
        elapsed = time.perf_counter() - start
        history = wa.history
    reference.Free()
    assert wa.state == "closed"
    return records, history, elapsed


def _check(wa, records, history):
    """Every property the issue names, checked on every rank for its own group."""
    group_versions = [t for t in range(ITERATIONS) if wa.is_group_version(t)]
    # Every version executed exactly once, in order.
    assert [v for v, _ in history] == group_versions
    used = WORLD.allgather(dict(history))

    def published(rank, c, t):
        if c >= 0 and not wa.is_group_version(c):   # a sync step published its sum
            return sum(value(q, c) for q in range(P))
        return value(rank, c)

    if wa.carry_over:   # what each version consumed: every iteration since the last one consumed
        consumed = [_consumed(q, used[q]) for q in range(P)]
        contribution = (lambda rank, c, t: consumed[rank][t])
    else:
        contribution = published

    previous = -1
    for t, fresh, contribution_iteration, total in records:
        if fresh is None:
            continue
        assert contribution_iteration == used[WORLD.rank][t]
        assert fresh == (contribution_iteration == t)
        if not (wa.carry_over and contribution_iteration == -1):   # -1: zeros
            assert previous <= contribution_iteration <= t     # never from the future
            previous = contribution_iteration
        group = next(g for g in butterfly_groups(P, wa.group_size, t) if WORLD.rank in g)
        expected = sum(contribution(q, used[q][t], t) for q in group)
        np.testing.assert_array_equal(total, expected, err_msg=f"version {t}")
    return used


def _consumed(rank, used):
    """With carry_over: version -> the sum ``rank`` gave, from its
    ``{version: contribution_iteration}`` (iteration -1: zeros): every
    iteration after the last one consumed, up to this one."""
    given, last = {}, -1
    for t, c in sorted(used.items()):
        given[t] = sum((value(rank, k) for k in range(last + 1, c + 1)),
                       np.zeros(NUMEL, dtype=np.int64))
        last = max(last, c)
    return given


@pytest.mark.timing
@needs_pow2
@pytest.mark.parametrize("group_size", sorted({1, 2, P}))
@pytest.mark.parametrize("tau", [None, 10])
def test_group_sums_are_what_members_published(group_size, tau):
    like = value(WORLD.rank, -1)
    wa = WaitAvoidingGroupAllreduce(WORLD, like, group_size=group_size, tau=tau,
                                    history=ITERATIONS)
    records, history, _ = _run(wa, _delays("random"))
    _check(wa, records, history)
    assert not any(t.name.startswith("wait-avoiding-progress") and t.is_alive()
                   for t in threading.enumerate())


@pytest.mark.timing
@needs_pow2
@pytest.mark.parametrize("waits", ["spin", "yield"])
def test_both_wait_policies_give_the_same_semantics(waits):
    # "auto" (the other tests) picks one by the node's cores; both are run here.
    wa = WaitAvoidingGroupAllreduce(WORLD, value(WORLD.rank, -1), group_size=min(2, P),
                                    waits=waits, history=ITERATIONS)
    records, history, _ = _run(wa, _delays("random"))
    _check(wa, records, history)
    assert wa.waits_used == waits


@pytest.mark.timing
@needs_pow2
@pytest.mark.parametrize("tau", [None, 4])
def test_fixed_groups_average_in_iteration_0s_groups(tau):
    """``dynamic_groups=False`` (WAGMA's ablation 2): every version's result
    is the mean over iteration 0's group (blocks of S consecutive ranks) of
    the contributions its members used, stale ones included; exact, the
    contributions being small integers (or a sync step's mean of them)."""
    S = P // 2 if P >= 4 else P
    mine = next(g for g in butterfly_groups(P, S, 0) if WORLD.rank in g)
    assert mine == list(range(WORLD.rank // S * S, WORLD.rank // S * S + S))
    iterations = 120
    delays = _delays("random")[:iterations]
    wa = WaitAvoidingGroupAllreduce(WORLD, value(WORLD.rank, -1).astype(np.float64), group_size=S,
                                    tau=tau, op="avg", history=iterations, dynamic_groups=False)
    records = []
    with wa:
        for t in range(iterations):
            time.sleep(delays[t])
            contribution = value(WORLD.rank, t).astype(np.float64)
            if wa.is_group_version(t):
                records.append((t, wa.allreduce(contribution, t).value))
            else:
                wa.sync_allreduce(contribution, t, op="avg")
                np.testing.assert_array_equal(contribution, sum(value(q, t) for q in range(P)) / P)
        history = wa.history
    used = WORLD.allgather(dict(history))

    def published(rank, c):
        if c >= 0 and not wa.is_group_version(c):   # a sync step published the global mean
            return sum(value(q, c) for q in range(P)) / P
        return value(rank, c)

    assert [t for t, _ in records] == [v for v, _ in history]
    for t, mean in records:
        expected = sum(published(q, used[q][t]) for q in mine) / S
        np.testing.assert_array_equal(mean, expected, err_msg=f"version {t}")
    # The dynamic groups would have been others at every other iteration.
    assert 1 < S < P or P < 4
    if 1 < S < P:
        assert any(mine not in butterfly_groups(P, S, t) for t, _ in records)


@pytest.mark.timing
@needs_pow2
def test_solo_allreduce_reduces_over_all_ranks():
    wa = solo_allreduce(WORLD, value(WORLD.rank, -1), history=ITERATIONS)
    records, history, _ = _run(wa, _delays("random"))
    _check(wa, records, history)


@pytest.mark.timing
@needs_pow2
@pytest.mark.parametrize("make", [solo_allreduce, majority_allreduce], ids=["solo", "majority"])
@pytest.mark.parametrize("delays", ["random", "straggler"])
def test_carry_over_applies_every_contribution_exactly_once(make, delays, record_measurement):
    """Eager-SGD's carry-over (issue 22, point 1): over a run, the sum of the
    versions' results plus what every rank still carries at the end equals
    the sum of every contribution of every rank, exactly (int64), under
    random delays and a persistent straggler; and late ranks did carry
    (some contribution entered a later version than its own)."""
    wa = make(WORLD, value(WORLD.rank, -1), history=ITERATIONS)
    records, history, _ = _run(wa, _delays(delays))
    applied = sum(total for *_, total in records)
    unconsumed = wa.unconsumed()
    left = WORLD.allreduce(np.zeros(NUMEL, dtype=np.int64) if unconsumed is None else unconsumed)
    computed = sum(value(q, t) for q in range(P) for t in range(ITERATIONS))
    np.testing.assert_array_equal(applied + left, computed)
    carried = WORLD.allreduce(sum(c not in (t, -1) for t, c in history))
    zeros = WORLD.allreduce(sum(c == -1 for _, c in history))
    if P > 1:
        record_measurement("versions that took a carried contribution", carried, 1, above=True)
        record_measurement("versions that took zeros", zeros, 1, above=True)
        assert carried > 0 and zeros > 0, (carried, zeros)


@pytest.mark.timing
@needs_pow2
def test_majority_allreduce_has_a_fresh_majority():
    wa = majority_allreduce(WORLD, value(WORLD.rank, -1), history=ITERATIONS)
    records, history, _ = _run(wa, _delays("random"))
    used = _check(wa, records, history)
    quorum = -(-P // 2)
    for t in range(ITERATIONS):
        fresh = sum(used[q][t] == t for q in range(P))
        assert fresh >= quorum, f"version {t}: {fresh} fresh contributions < {quorum}"


@pytest.mark.timing
@needs_pow2
@pytest.mark.skipif(P < 2, reason="needs a slow and a fast rank")
@pytest.mark.parametrize("tau", [None, 10])
def test_persistent_straggler(tau, capsys, record_measurement):
    # Rank P-1 sleeps 5 ms every iteration; the others do not sleep at all.
    wa = WaitAvoidingGroupAllreduce(WORLD, value(WORLD.rank, -1), group_size=2,
                                    tau=tau, history=ITERATIONS)
    records, history, elapsed = _run(wa, _delays("straggler"))
    used = _check(wa, records, history)
    # The straggler was left several versions behind and served them passively.
    lag = max(t - used[P - 1][t] for t in used[P - 1])
    record_measurement("the straggler's largest lag, versions", lag, 2, above=True)
    assert lag >= 2
    per_iteration = WORLD.gather(elapsed / ITERATIONS)
    if WORLD.rank == 0:
        fast = np.mean(per_iteration[:-1]) * 1e3
        with capsys.disabled():
            print(f"\n[straggler, {P} ranks, S=2, tau={tau}] ms per iteration: "
                  f"fast ranks {fast:.2f}, straggler {per_iteration[-1] * 1e3:.2f}, "
                  f"straggler's largest lag {lag} versions")


@needs_pow2
def test_misuse_is_refused():
    wa = WaitAvoidingGroupAllreduce(WORLD, value(WORLD.rank, -1), group_size=1, tau=2)
    with pytest.raises(RuntimeError, match="call open"):
        wa.allreduce(value(WORLD.rank, 0), 0)
    with wa:
        with pytest.raises(ValueError, match="t must be the next iteration, 0, got 3"):
            wa.allreduce(value(WORLD.rank, 3), 3)
        with pytest.raises(ValueError, match="buffer must be contiguous with 33 elements"):
            wa.allreduce(np.zeros(5, dtype=np.int64), 0)
        mine = value(WORLD.rank, 0)
        result = wa.allreduce(mine, 0)
        with pytest.raises(ValueError, match=r"iteration 1 is a sync step \(tau=2\)"):
            wa.allreduce(value(WORLD.rank, 1), 1)
        wa.sync_allreduce(result.value, 1)
        # Iteration 0's buffer is still lent: passing it again would let the
        # caller write into what later passive versions read.
        with pytest.raises(ValueError, match="buf is a buffer this collective holds"):
            wa.allreduce(mine, 2)
        wa.allreduce(result.value, 2)
        wa.sync_allreduce(value(WORLD.rank, 3), 3)
    with pytest.raises(RuntimeError, match="open\\(\\) on a closed"):
        wa.open()


@needs_pow2
@pytest.mark.parametrize("options, error, text", [
    (dict(group_size=3), ValueError, "group_size must be a power of two"),
    (dict(group_size=2 * P), ValueError, f"group_size must be a power of two <= world size {P}"),
    (dict(group_size=1, tau=0), ValueError, "tau must be an int >= 1 or None, got 0"),
    (dict(group_size=1, activation="last"), ValueError, "activation must be one of 'first', 'majority'"),
    (dict(group_size=1, algorithm="ring"), ValueError, "algorithm must be one of"),
    (dict(group_size=1, waits="poll"), ValueError, "waits must be one of 'auto', 'spin', 'yield', got 'poll'"),
    (dict(group_size=1, dynamic_groups=0), TypeError, "dynamic_groups must be True or False, got 0"),
    (dict(group_size=1, carry_over=1), TypeError, "carry_over must be True or False, got 1"),
    (dict(group_size=1, tau=10, carry_over=True), ValueError,
     r"carry_over needs tau=None \(sync steps average models; carried contributions are "
     r"gradients\), got tau=10"),
])
def test_bad_arguments_raise_on_every_rank(options, error, text):
    wa = WaitAvoidingGroupAllreduce(WORLD, value(WORLD.rank, -1), **options)
    with pytest.raises(error, match=text):
        wa.open()
    assert wa.state == "closed"


@needs_pow2
@pytest.mark.skipif(P < 2, reason="needs two ranks to disagree")
def test_buffers_of_different_sizes_raise_on_every_rank():
    like = np.zeros(NUMEL + (WORLD.rank == P - 1), dtype=np.int64)
    with pytest.raises(ValueError, match="numel must be the same on every rank"):
        WaitAvoidingGroupAllreduce(WORLD, like, group_size=1).open()


@pytest.mark.skipif(P < 3, reason="needs three ranks")
def test_world_not_power_of_two_raises():
    three = WORLD.Split(0 if WORLD.rank < 3 else MPI.UNDEFINED, WORLD.rank)
    if three == MPI.COMM_NULL:
        pytest.skip("outside the three-rank communicator")
    with pytest.raises(ValueError, match="ranks 0-2: world_size must be a power of two"):
        WaitAvoidingGroupAllreduce(three, np.zeros(4), group_size=1).open()
    three.Free()



@needs_pow2
def test_leaving_on_an_error_stops_the_thread_without_a_collective():
    wa = WaitAvoidingGroupAllreduce(WORLD, value(WORLD.rank, -1), group_size=1)
    with pytest.raises(KeyError):
        with wa:
            wa.allreduce(value(WORLD.rank, 0), 0)
            raise KeyError("a failure in the training step")
    assert wa.state == "closed" and not wa._engine.alive
