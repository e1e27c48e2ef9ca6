"""StragglAR schedules as data, the verifier, and the alpha-beta cost model (no MPI)."""

import math

import pytest

from collectives.stragglar import (
    Schedule,
    ScheduleError,
    Transfer,
    broadcast_time,
    rhd_time,
    ring_time,
    stragglar_time,
    verify,
)


def T(src, dst, chunk, reduce=False):
    return Transfer(src, dst, chunk, reduce)


def exchange(rank, straggler, chunk):
    return [T(rank, straggler, chunk, True), T(straggler, rank, chunk, True)]


# n = 4, straggler 3, built by hand from the paper's rules: 4 = n + log2 n - 2 rounds.
N4 = [
    exchange(0, 3, 0),
    exchange(1, 3, 1) + [T(0, 2, 0)],  # phase 1: r-1 -> r-1+log n
    exchange(2, 3, 2) + [T(0, 1, 0), T(1, 0, 1)],  # phase 2: c0 holders meet c1's
    [T(3, 0, 2), T(1, 2, 1), T(2, 1, 2)],  # the straggler sends the last chunk
]


def test_hand_built_schedules_pass():
    four = verify(Schedule(4, 3, N4))
    assert len(four.rounds) == 4 + int(math.log2(4)) - 2
    assert repr(four) == "Schedule(n=4, straggler=3, 4 rounds, 12 transfers)"
    verify(Schedule(2, 1, [exchange(0, 1, 0)]))
    # Straggler 0: chunk 0 is held by the first non-straggler, rank 1.
    two = verify(Schedule(2, 0, [exchange(1, 0, 0)]))
    assert two.owner(0) == 1


def test_json_round_trip():
    four = Schedule(4, 3, N4)
    assert Schedule.from_json(four.to_json()) == four
    with pytest.raises(ValueError, match="not a StragglAR schedule"):
        Schedule.from_json('{"n": 4, "rounds": []}')


def _broken(mutate):
    rounds = [list(r) for r in N4]
    mutate(rounds)
    return Schedule(4, 3, rounds)


@pytest.mark.parametrize(
    "mutate, text",
    [
        (lambda r: r[1].append(T(0, 1, 0)), "rank 0 sends twice in one round"),
        (lambda r: r[1].__setitem__(2, T(2, 0, 2)), "copies a chunk rank 2 does not hold fully reduced"),
        (lambda r: r[3].append(T(0, 1, 0)), "rank 1 receives twice"),
        (
            lambda r: r.__setitem__(0, exchange(0, 3, 0) + [T(1, 2, 1, True)]),
            "reduces a chunk that rank 2 holds no data of",
        ),
        (
            lambda r: r.insert(1, exchange(0, 3, 0)),
            r"double counting: contributions of ranks \[0, 1, 2, 3\] would be added twice",
        ),
        (lambda r: r.pop(), "rank 0 does not hold chunk 2 fully reduced"),
        (lambda r: r[3].append(T(2, 2, 0)), "two distinct ranks"),
        (lambda r: r[3].append(T(0, 3, 5)), r"chunk must be in range\(3\)"),
    ],
)
def test_every_rule_rejects_its_mistake(mutate, text):
    with pytest.raises(ScheduleError, match=text):
        verify(_broken(mutate))


def test_bad_schedule_arguments():
    with pytest.raises(ValueError, match="n must be an int >= 2, got 1"):
        Schedule(1, 0, [])
    with pytest.raises(ValueError, match=r"straggler must be a rank in range\(4\), got 4"):
        Schedule(4, 4, [])


def test_cost_model_closed_forms():
    n, s, a, b = 8, 2**30, 3e-6, 1 / (450 * 2**30)
    assert ring_time(n, s, a, b) == pytest.approx(14 * a + 1.75 * s * b)
    assert rhd_time(n, s, a, b) == pytest.approx(6 * a + 1.75 * s * b)
    assert broadcast_time(n, s, a, b) == pytest.approx(3 * (a + s * b))
    rounds = n + 3 - 2
    assert stragglar_time(n, s, a, b, rounds) == pytest.approx(rounds * a + rounds / 7 * s * b)
    # Bandwidth-bound: StragglAR's (n + log n - 2)/(n - 1) < 2(n - 1)/n for n >= 4.
    for n in (4, 8, 64, 256):
        r = n + int(math.log2(n)) - 2
        assert stragglar_time(n, s, 0, b, r) < ring_time(n, s, 0, b)
