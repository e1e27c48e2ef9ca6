"""The wait-avoiding group allreduce and eager-SGD's partial collectives, under mpiexec.

Contributions are integers that name their rank and iteration,
``value(rank, t) = rank * 10**6 + t + 1`` (plus the element index), so every
group sum can be checked exactly against the contributions its members
actually used, which each rank's ``history`` records.

The tests run on COMM_WORLD, whatever its size; where marked ``ON_ODD``
also, at the stages of 4 and 8 ranks, on blocks of 3 and of 5 and 3 ranks
side by side (:data:`subcomms.ODD_BLOCKS`), whose groups fold the ranks
above the largest power of two.
"""

import threading
import time

import numpy as np
import pytest
from mpi4py import MPI
from subcomms import ODD_BLOCKS, block_of

from collectives import (
    WaitAvoidingGroupAllreduce,
    butterfly_groups,
    majority_allreduce,
    solo_allreduce,
)
from collectives.wait_avoiding.collective import IDLE_ENV

pytestmark = pytest.mark.mpi

WORLD = MPI.COMM_WORLD
P = WORLD.size
NUMEL = 33
ITERATIONS = 520
#: The odd blocks' iterations: each version is checked exactly, and 200 fold
#: every folded rank at every iteration of a period many times over.
ODD_ITERATIONS = 200


@pytest.fixture
def comm(request):
    """The communicator a case runs on (a raw ``MPI.Intracomm``): COMM_WORLD,
    or with ``"odd"`` this rank's block of :data:`subcomms.ODD_BLOCKS` (a
    rank in a block of one skips)."""
    if getattr(request, "param", "world") == "world":
        yield WORLD
        return
    if P not in ODD_BLOCKS:
        pytest.skip(f"odd blocks are cut from 4 or 8 ranks; {P} ranks run as the world")
    raw = block_of(ODD_BLOCKS[P])
    try:
        if raw.Get_size() == 1:
            pytest.skip("this rank is a block of one")
        yield raw
    finally:
        raw.Free()


#: Run a test on COMM_WORLD and on the odd blocks.
ON_ODD = pytest.mark.parametrize("comm", ["world", "odd"], indirect=True)


def value(rank, t):
    return rank * 10**6 + t + 1 + np.arange(NUMEL, dtype=np.int64)


def _delays(comm, kind, seed=7, iterations=ITERATIONS):
    """Per-iteration sleep of this rank, in seconds."""
    rng = np.random.default_rng([seed, comm.rank])
    if kind == "random":
        return rng.random(iterations) * 2e-3 + (rng.random(iterations) < 0.05) * 1e-2
    slow = comm.rank == comm.size - 1
    return np.full(iterations, 5e-3 if slow else 0.0)


def _run(comm, wa, delays):
    """Drive ``wa`` for ``len(delays)`` steps; returns the per-step records.

    Every contribution is a new buffer, lent to the collective; the results
    are kept as they came (the caller owns them).  A lent buffer must still
    hold what it held after the call (its contribution, plus under
    ``late="accumulate"`` the one it carried) when the next one replaces it:
    while published it is only read.  A sync step's result is checked here
    against MPI's allreduce of the contributions when every version reads
    the last published one, and by :func:`_check` under a late reading.
    """
    records, lent, reference = [], None, comm.Dup()
    with wa:
        start = time.perf_counter()
        for t in range(len(delays)):
            time.sleep(delays[t])
            if lent is not None:
                np.testing.assert_array_equal(lent[1], lent[2], err_msg=f"the buffer lent at {lent[0]} was written")
            contribution = value(comm.rank, t)
            if wa.is_group_version(t):
                result = wa.allreduce(contribution, t)
                assert result.version == t
                assert result.group_size == len(wa.grouping.group_of(t, comm.rank))
                assert result.value is not contribution
                lent = (t, contribution, contribution.copy())
                records.append((t, result.fresh, result.contribution_iteration, result.value))
            else:
                expected = np.empty_like(contribution)
                reference.Allreduce(contribution, expected)
                wa.sync_allreduce(contribution, t)  # publishes a copy, or settles
                lent = None
                if wa.late is None:
                    np.testing.assert_array_equal(contribution, expected)
                records.append((t, None, None, contribution.copy()))
        elapsed = time.perf_counter() - start
        history = wa.history
    reference.Free()
    assert wa.state == "closed"
    return records, history, elapsed


def _check(comm, wa, records, history):
    """Every version's result, exactly, on every rank for its own group:
    the sum of what each member gave, from the members' histories."""
    P, rank = comm.size, comm.rank
    iterations = len(records)
    group_versions = [t for t in range(iterations) if wa.is_group_version(t)]
    # Every version executed exactly once, in order.
    assert [v for v, _ in history] == group_versions
    used = comm.allgather(dict(history))

    def published(rank, c, t):
        if c >= 0 and not wa.is_group_version(c):  # a sync step published its sum
            return sum(value(q, c) for q in range(P))
        return value(rank, c)

    if wa.late is not None:  # a sync step takes every rank's fresh contribution
        syncs = {t: t for t in range(iterations) if not wa.is_group_version(t)}
        given = [_given(q, {**used[q], **syncs}, wa.late) for q in range(P)]

        def contribution(rank, c, t):
            return given[rank][t]
    else:
        contribution = published

    previous = -1
    for t, fresh, contribution_iteration, total in records:
        if fresh is None:
            if wa.late is not None:
                np.testing.assert_array_equal(total, sum(given[q][t] for q in range(P)), err_msg=f"sync step {t}")
            continue
        assert contribution_iteration == used[rank][t]
        assert fresh == (contribution_iteration == t)
        if not (wa.late and contribution_iteration == -1):  # -1: zeros
            assert previous <= contribution_iteration <= t  # never from the future
            previous = contribution_iteration
        group = next(g for g in butterfly_groups(P, wa.group_size, t) if rank in g)
        expected = sum(contribution(q, used[q][t], t) for q in group)
        np.testing.assert_array_equal(total, expected, err_msg=f"version {t}")
    return used


def _given(rank, used, late):
    """Under a late reading: version -> what ``rank`` gave to it, from its
    ``{version: contribution_iteration}`` (iteration -1: zeros).
    ``"accumulate"``: every iteration after the last one given, up to this
    one; ``"newest"`` and ``"drop"``: that iteration's contribution alone."""
    given, last = {}, -1
    for t, c in sorted(used.items()):
        first = last + 1 if late == "accumulate" else max(c, 0)
        given[t] = sum((value(rank, k) for k in range(first, c + 1)), np.zeros(NUMEL, dtype=np.int64))
        last = max(last, c)
    return given


# The two tests below run their full grids at 2 and 4 ranks and a reduced set
# at 8 (where each case costs 2 to 5 s): what they check is exact (integer sums
# against the histories) and the same at any rank count, and 8 ranks add only
# the deeper butterfly and more late ranks.  So at 8, group size P (all three
# phases of the butterfly) with and without tau, and one collective per late
# reading, every collective and delay pattern still among them.  A world that
# is not a power of two (by hand) adds S = 2, groups that fold and change.
# The odd blocks of the stages of 4 and 8 ranks run S = 2 with tau: groups of
# 3 (one of them folded) and, on 5, two groups of 2 and 3 that change.
def _group_cases():
    for tau in (None, 10):
        for group_size in sorted({1, 2, P}):
            yield pytest.param(
                "world",
                group_size,
                tau,
                marks=pytest.mark.skipif(
                    P > 4 and group_size != P and not (group_size == 2 and P & (P - 1)),
                    reason=f"group size {group_size} is checked at 2 and 4 ranks; at {P} ranks only the "
                    f"group of all {P}, whose butterfly is the deepest",
                ),
            )
    yield pytest.param("odd", 2, 10)


@pytest.mark.timing
@pytest.mark.parametrize("comm, group_size, tau", list(_group_cases()), indirect=["comm"])
def test_group_sums_are_what_members_published(comm, group_size, tau):
    like = value(comm.rank, -1)
    iterations = ITERATIONS if comm is WORLD else ODD_ITERATIONS
    wa = WaitAvoidingGroupAllreduce(comm, like, group_size=group_size, tau=tau, history=iterations)
    records, history, _ = _run(comm, wa, _delays(comm, "random", iterations=iterations))
    _check(comm, wa, records, history)
    assert not any(t.name.startswith("wait-avoiding-progress") and t.is_alive() for t in threading.enumerate())


@pytest.mark.timing
@pytest.mark.parametrize("waits", ["spin", "yield"])
def test_both_wait_policies_give_the_same_semantics(comm, waits):
    # "auto" (the other tests) picks one by the node's cores; both are run here.
    wa = WaitAvoidingGroupAllreduce(comm, value(comm.rank, -1), group_size=min(2, P), waits=waits, history=ITERATIONS)
    records, history, _ = _run(comm, wa, _delays(comm, "random"))
    _check(comm, wa, records, history)
    assert wa.waits_used == waits


@pytest.mark.timing
@pytest.mark.parametrize("waits", ["spin", "yield"])
@pytest.mark.parametrize("comm", ["world", "odd"], indirect=True)
def test_the_librarys_group_allreduce_gives_the_same_semantics(comm, waits):
    """``algorithm="mpi"``: every version runs the library's blocking
    ``MPI_Allreduce`` on its group's communicator, from the main thread on
    one member and the progress thread on another (a mix of blocking and
    nonblocking calls hung here); groups of 2, and on the odd blocks groups
    that fold a rank, with a sync step every 10 iterations."""
    size = comm.Get_size()
    iterations = ITERATIONS if comm is WORLD else ODD_ITERATIONS
    wa = WaitAvoidingGroupAllreduce(
        comm, value(comm.rank, -1), group_size=min(2, size), tau=10, algorithm="mpi", waits=waits, history=iterations
    )
    records, history, _ = _run(comm, wa, _delays(comm, "random", iterations=iterations))
    _check(comm, wa, records, history)


@pytest.mark.timing
@pytest.mark.parametrize("tau", [None, 4])
def test_fixed_groups_average_in_iteration_0s_groups(comm, tau):
    """``dynamic_groups=False`` (WAGMA's ablation 2): every version's result
    is the mean over iteration 0's group (for powers of two blocks of S
    consecutive ranks) of the contributions its members used, stale ones
    included; exact, the contributions being small integers (or a sync
    step's mean of them), scaled by the reciprocal of the group's size as
    the schedules scale."""
    if tau and P & (P - 1):
        pytest.skip(
            f"a mean over {P} ranks is not exact in binary, and the group sums of such means round "
            "in the order of the schedule's additions: checked on powers of two"
        )
    S = P // 2 if P >= 4 else P
    mine = next(g for g in butterfly_groups(P, S, 0) if comm.rank in g)
    if P & (P - 1) == 0:
        assert mine == list(range(comm.rank // S * S, comm.rank // S * S + S))
    iterations = 120
    delays = _delays(comm, "random")[:iterations]
    wa = WaitAvoidingGroupAllreduce(
        comm,
        value(comm.rank, -1).astype(np.float64),
        group_size=S,
        tau=tau,
        op="avg",
        history=iterations,
        dynamic_groups=False,
    )
    records = []
    with wa:
        for t in range(iterations):
            time.sleep(delays[t])
            contribution = value(comm.rank, t).astype(np.float64)
            if wa.is_group_version(t):
                records.append((t, wa.allreduce(contribution, t).value))
            else:
                wa.sync_allreduce(contribution, t, op="avg")
                np.testing.assert_array_equal(contribution, sum(value(q, t) for q in range(P)) * (1.0 / P))
        history = wa.history
    used = comm.allgather(dict(history))

    def published(rank, c):
        if c >= 0 and not wa.is_group_version(c):  # a sync step published the global mean
            return sum(value(q, c) for q in range(P)) * (1.0 / P)
        return value(rank, c)

    assert [t for t, _ in records] == [v for v, _ in history]
    for t, mean in records:
        expected = sum(published(q, used[q][t]) for q in mine) * (1.0 / len(mine))
        np.testing.assert_array_equal(mean, expected, err_msg=f"version {t}")
    # The dynamic groups would have been others at every other iteration.
    assert 1 < S < P or P < 4
    if 1 < S < P:
        assert any(mine not in butterfly_groups(P, S, t) for t, _ in records)


EAGER_ITERATIONS = 240

#: Eager-SGD's collectives: solo with a limiter of 4 (every fifth version
#: waits for every rank), and the majority whose activator is drawn per version.
EAGER = {
    "solo": lambda comm, like, **kw: solo_allreduce(comm, like, limiter=4, **kw),
    "majority": lambda comm, like, **kw: majority_allreduce(comm, like, activator_seed=5, **kw),
}


#: At more than 4 ranks, one (collective, delays) per late reading: "drop" beside
#: the straggler (late at most versions: the most contributions to drop),
#: "newest" under random delays (where its carried contributions are asserted)
#: and "accumulate", the exact conservation, over the majority's random activators.
LATE_READINGS_PAST_4 = {
    "drop": ("solo", "straggler"),
    "newest": ("solo", "random"),
    "accumulate": ("majority", "random"),
}


def _late_readings():
    for late in ("drop", "newest", "accumulate"):
        for collective, delays in (("solo", "random"), ("majority", "random"), ("solo", "straggler")):
            yield pytest.param(
                "world",
                collective,
                delays,
                late,
                id=f"{collective}-{delays}-{late}",
                marks=pytest.mark.skipif(
                    P > 4 and LATE_READINGS_PAST_4[late] != (collective, delays),
                    reason=f"checked at 2 and 4 ranks; at {P} ranks one collective per "
                    f"late reading, {late!r} with {LATE_READINGS_PAST_4[late]}",
                ),
            )
    # The odd blocks: the exact conservation, over all ranks folded into a power of two.
    yield pytest.param("odd", "majority", "random", "accumulate", id="odd-majority-random-accumulate")


@pytest.mark.timing
@pytest.mark.parametrize("comm, collective, delays, late", list(_late_readings()), indirect=["comm"])
def test_a_late_contribution_meets_its_reading(comm, collective, delays, late, record_measurement):
    """Eager-SGD's gradients are consumed: each version sums exactly what
    its members gave (checked against every rank's history, integers), a
    sync step of the limiter every rank's fresh contribution plus what it
    settles, and a late contribution, one published after its version
    began, is

    - ``"drop"``: never applied (every rank gives its iteration-t
      contribution to version t, or zeros);
    - ``"newest"``: applied once, in the next version, unless a newer one
      replaced it (a rank's contributions enter in increasing order, each
      at most once);
    - ``"accumulate"``: applied exactly once: the results plus what every
      rank still holds at the end sum to every contribution of every rank.

    Under random delays and a persistent straggler (rank P - 1, 5 ms per
    iteration), which is late at most versions."""
    wa = EAGER[collective](comm, value(comm.rank, -1), late=late, history=EAGER_ITERATIONS)
    records, history, _ = _run(comm, wa, _delays(comm, delays, iterations=EAGER_ITERATIONS))
    used = _check(comm, wa, records, history)
    mine = [c for _, c in history]
    if late == "drop":
        assert all(c in (t, -1) for t, c in history), "a late contribution was applied"
    if late == "newest":
        given = [c for c in mine if c >= 0]
        assert given == sorted(set(given)), "a contribution entered twice or out of order"
    if late == "accumulate":
        applied = sum(total for *_, total in records)
        unconsumed = wa.unconsumed()
        left = comm.allreduce(np.zeros(NUMEL, dtype=np.int64) if unconsumed is None else unconsumed)
        computed = sum(value(q, t) for q in range(comm.size) for t in range(EAGER_ITERATIONS))
        np.testing.assert_array_equal(applied + left, computed)
    carried = comm.allreduce(_applied_later(wa, history, late, EAGER_ITERATIONS))
    zeros = comm.allreduce(mine.count(-1))
    if comm.size > 1:
        record_measurement("versions that took zeros", zeros, 1, above=True)
        assert zeros > 0, "no rank was ever late: the reading was not exercised"
        # Under "newest" only a group version that begins between a late publication and the rank's
        # next one takes it; beside a straggler the fast ranks finish every version up to the
        # limiter's synchronous one before the straggler's late gradients exist, and that version
        # takes the newest alone.  Under "accumulate" the synchronous version takes them all.
        if late == "accumulate" or (late == "newest" and delays == "random"):
            record_measurement("late contributions applied later", carried, 1, above=True)
            assert carried > 0, "no late contribution entered a later version"
    assert len(used) == comm.size


def _applied_later(wa, history, late, iterations):
    """How many of this rank's contributions entered a later version than
    their own, the limiter's synchronous ones included (which take every
    iteration the rank had not given yet under "accumulate")."""
    syncs = {t: t for t in range(iterations) if not wa.is_group_version(t)}
    count, last = 0, -1
    for t, c in sorted({**dict(history), **syncs}.items()):
        if late == "accumulate":
            count += sum(1 for k in range(last + 1, c + 1) if k < t)
        elif late == "newest":
            count += 0 <= c < t
        last = max(last, c)
    return count


def test_the_activator_sequence_is_the_same_on_every_rank_and_always_fresh(comm):
    """``activation="random"``: every rank draws the same activator for
    every version from the seed (and a resumed collective the same
    continuation), a different seed draws another sequence, every rank
    is drawn, and no version begins before its activator arrives: the
    activator's own contribution is fresh in every version it activated,
    whatever the delays."""
    wa = majority_allreduce(comm, value(comm.rank, -1), activator_seed=11, history=EAGER_ITERATIONS)
    records, history, _ = _run(comm, wa, _delays(comm, "random", iterations=EAGER_ITERATIONS))
    _check(comm, wa, records, history)
    sequence = [wa.activator(t) for t in range(EAGER_ITERATIONS)]
    assert comm.allgather(sequence) == [sequence] * P
    assert set(sequence) == set(range(P))
    resumed = majority_allreduce(comm, value(comm.rank, -1), activator_seed=11, first_iteration=100)
    assert [resumed.activator(t) for t in range(100, EAGER_ITERATIONS)] == sequence[100:]
    other = majority_allreduce(comm, value(comm.rank, -1), activator_seed=12)
    if P > 1:
        assert [other.activator(t) for t in range(EAGER_ITERATIONS)] != sequence
    for t, c in history:
        if sequence[t] == comm.rank:
            assert c == t, f"version {t} began before its activator, this rank, arrived"


@pytest.mark.timing
@pytest.mark.skipif(P < 2, reason="needs a straggler and others")
def test_a_random_activator_starts_its_version_on_arrival(comm, record_measurement):
    """The majority's versions start when their activator arrives, neither
    earlier nor later: rank P - 1 arrives 40 ms after the others at every
    iteration, so at a version it activates the others' contributions are
    fresh (they arrived long before it, and waited), and at the others'
    versions the straggler's is stale (its version began without it).

    Bounds: three quarters of each.  That a version never begins before its
    activator arrives holds at every version (the test above); that it
    begins at that arrival holds up to the OS's scheduling, which can hold
    a rank of an oversubscribed node back for more than the 40 ms: with a
    20 ms lead and every rank required, Open MPI on 2 ranks beside a
    4-rank test stage left the straggler fresh at 2 of 21 of the others'
    versions."""
    iterations = 40
    wa = majority_allreduce(comm, value(comm.rank, -1), activator_seed=3, history=iterations)
    delays = np.full(iterations, 0.04 if comm.rank == P - 1 else 0.0)
    records, history, _ = _run(comm, wa, delays)
    used = _check(comm, wa, records, history)
    activators = [wa.activator(t) for t in range(iterations)]
    by_straggler = [t for t in range(iterations) if activators[t] == P - 1]
    by_others = [t for t in range(iterations) if activators[t] != P - 1]
    assert by_straggler and by_others
    waited = sum(used[q][t] == t for t in by_straggler for q in range(P - 1))
    pairs = len(by_straggler) * (P - 1)
    record_measurement("others fresh at the straggler's versions", waited, 0.75 * pairs, above=True)
    stale = sum(used[P - 1][t] != t for t in by_others)
    record_measurement(
        "the straggler's stale versions among those others activated", stale, 0.75 * len(by_others), above=True
    )
    assert waited >= 0.75 * pairs, f"{waited} of {pairs} fresh"
    assert stale >= 0.75 * len(by_others), f"stale at {stale} of {len(by_others)}"


@pytest.mark.timing
@ON_ODD
def test_half_activation_has_a_fresh_majority(comm):
    iterations = ITERATIONS if comm is WORLD else ODD_ITERATIONS
    wa = majority_allreduce(comm, value(comm.rank, -1), activation="half", history=iterations)
    records, history, _ = _run(comm, wa, _delays(comm, "random", iterations=iterations))
    used = _check(comm, wa, records, history)
    quorum = -(-comm.size // 2)
    for t in range(iterations):
        fresh = sum(used[q][t] == t for q in range(comm.size))
        assert fresh >= quorum, f"version {t}: {fresh} fresh contributions < {quorum}"


@pytest.mark.timing
@pytest.mark.skipif(P < 2, reason="needs a slow and a fast rank")
@pytest.mark.parametrize("tau", [None, 10])
def test_persistent_straggler(comm, tau, capsys, record_measurement):
    # Rank P-1 sleeps 5 ms every iteration; the others do not sleep at all.
    wa = WaitAvoidingGroupAllreduce(comm, value(comm.rank, -1), group_size=2, tau=tau, history=ITERATIONS)
    records, history, elapsed = _run(comm, wa, _delays(comm, "straggler"))
    used = _check(comm, wa, records, history)
    # The straggler was left several versions behind and served them passively.
    lag = max(t - used[P - 1][t] for t in used[P - 1])
    record_measurement("the straggler's largest lag, versions", lag, 2, above=True)
    assert lag >= 2
    per_iteration = comm.gather(elapsed / ITERATIONS)
    if comm.rank == 0:
        fast = np.mean(per_iteration[:-1]) * 1e3
        with capsys.disabled():
            print(
                f"\n[straggler, {P} ranks, S=2, tau={tau}] ms per iteration: "
                f"fast ranks {fast:.2f}, straggler {per_iteration[-1] * 1e3:.2f}, "
                f"straggler's largest lag {lag} versions"
            )


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


@pytest.mark.timing
@pytest.mark.parametrize("idle", ["backoff", "park", "mixed"])
@pytest.mark.parametrize("activation", ["first", "random"])
def test_both_idle_policies_give_the_same_semantics(comm, idle, activation):
    """Whether the progress thread sleeps with back-off or waits in MPI when
    idle, and however the main thread's wake-ups and the activations
    interleave with it, every version runs exactly once with exact sums;
    also where ranks chose differently (``mixed``: odd ranks park), as
    nodes of different shapes do under ``"auto"``."""
    if idle == "mixed":
        idle = "park" if comm.rank % 2 else "backoff"
    wa = WaitAvoidingGroupAllreduce(
        comm, value(comm.rank, -1), group_size=min(2, P), activation=activation, idle=idle, history=ITERATIONS
    )
    records, history, _ = _run(comm, wa, _delays(comm, "random"))
    _check(comm, wa, records, history)
    assert wa.idle_used == idle


def _until(condition, what, seconds=30.0):
    """Poll ``condition`` until it holds (a failure after ``seconds``)."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(1e-3)


@pytest.mark.skipif(P < 2, reason="needs an activator and a rank it activates")
def test_an_activation_wakes_a_progress_thread_that_waits_in_mpi(comm):
    """``idle="park"``: an idle progress thread waits in MPI, not in a
    back-off sleep, and the activation that reaches it starts the version
    there before its main thread arrives."""
    wa = WaitAvoidingGroupAllreduce(comm, value(comm.rank, -1), group_size=P, idle="park", history=4)
    with wa:
        reference = comm.Dup()
        buf = value(comm.rank, 0)
        if comm.rank != 0:
            _until(lambda: wa._engine.parked, "the idle progress thread never waited in MPI")
        reference.Barrier()
        if comm.rank == 0:
            buf = wa.allreduce(buf, 0).value
        else:
            _until(lambda: any(v == 0 for v, _ in wa.began), "version 0 never began on this rank")
            result = wa.allreduce(buf, 0)
            assert not result.fresh  # it began before this rank arrived: the activation started it
            buf = result.value
        np.testing.assert_array_equal(buf, sum(value(r, 0) if r == 0 else value(r, -1) for r in range(P)))
        reference.Free()


@pytest.mark.parametrize(
    "options, error, text",
    [
        (dict(group_size=0), ValueError, f"group_size must be an int from 1 to the world size {P}, got 0"),
        (dict(group_size=2 * P), ValueError, f"group_size must be an int from 1 to the world size {P}, got {2 * P}"),
        (dict(group_size=1, tau=0), ValueError, "tau must be an int >= 1 or None, got 0"),
        (dict(group_size=1, activation="last"), ValueError, "activation must be one of 'first', 'random', 'half'"),
        (
            dict(group_size=1, activation="random", activator_seed=-1),
            ValueError,
            "activator_seed must be an int >= 0, got -1",
        ),
        (dict(group_size=1, algorithm="ring"), ValueError, "algorithm must be one of"),
        (dict(group_size=1, waits="poll"), ValueError, "waits must be one of 'auto', 'spin', 'yield', got 'poll'"),
        (dict(group_size=1, idle="spin"), ValueError, "idle must be one of 'auto', 'backoff', 'park', got 'spin'"),
        (dict(group_size=1, dynamic_groups=0), TypeError, "dynamic_groups must be True or False, got 0"),
        (
            dict(group_size=1, late="keep"),
            ValueError,
            "late must be None or one of 'drop', 'newest', 'accumulate', got 'keep'",
        ),
    ],
)
def test_bad_arguments_raise_on_every_rank(options, error, text):
    wa = WaitAvoidingGroupAllreduce(WORLD, value(WORLD.rank, -1), **options)
    with pytest.raises(error, match=text):
        wa.open()
    assert wa.state == "closed"


def test_a_bad_idle_policy_in_the_environment_is_refused_and_a_good_one_chosen(monkeypatch):
    monkeypatch.setenv(IDLE_ENV, "spin")
    wa = WaitAvoidingGroupAllreduce(WORLD, value(WORLD.rank, -1), group_size=1)
    with pytest.raises(ValueError, match=f"{IDLE_ENV} must be one of 'backoff', 'park' or unset, got 'spin'"):
        wa.open()
    monkeypatch.setenv(IDLE_ENV, "park")
    with WaitAvoidingGroupAllreduce(WORLD, value(WORLD.rank, -1), group_size=1, tau=4) as wa:
        assert wa.idle_used == "park"


@pytest.mark.skipif(P < 2, reason="needs two ranks to disagree")
def test_buffers_of_different_sizes_raise_on_every_rank():
    like = np.zeros(NUMEL + (WORLD.rank == P - 1), dtype=np.int64)
    with pytest.raises(ValueError, match="numel must be the same on every rank"):
        WaitAvoidingGroupAllreduce(WORLD, like, group_size=1).open()


@pytest.mark.skipif(P < 3, reason="needs three ranks")
def test_a_group_larger_than_three_ranks_raises_on_each_of_them():
    three = WORLD.Split(0 if WORLD.rank < 3 else MPI.UNDEFINED, WORLD.rank)
    if three == MPI.COMM_NULL:
        pytest.skip("outside the three-rank communicator")
    with pytest.raises(ValueError, match="ranks 0-2: group_size must be an int from 1 to the world size 3, got 4"):
        WaitAvoidingGroupAllreduce(three, np.zeros(4), group_size=4).open()
    three.Free()


def test_leaving_on_an_error_stops_the_thread_without_a_collective():
    wa = WaitAvoidingGroupAllreduce(WORLD, value(WORLD.rank, -1), group_size=1)
    with pytest.raises(KeyError):
        with wa:
            wa.allreduce(value(WORLD.rank, 0), 0)
            raise KeyError("a failure in the training step")
    assert wa.state == "closed" and not wa._engine.alive
