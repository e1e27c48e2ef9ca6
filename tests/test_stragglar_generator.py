"""The StragglAR schedule generator: every schedule verified, round counts, arguments."""

import pytest

from collectives.stragglar import Schedule, generate, lower_bound, verify
from collectives.stragglar.generator import deadline_rounds, power_of_two_rounds

EVEN = range(2, 257, 2)


def test_lower_bound_formula():
    assert [lower_bound(n) for n in (2, 4, 6, 8, 12, 14, 256)] == [1, 4, 7, 9, 14, 16, 262]


@pytest.mark.parametrize("n", [n for n in EVEN if n & (n - 1) == 0] + [512, 1024])
def test_power_of_two_meets_the_lower_bound(n):
    """Algorithm 1: exactly n + log2 n - 2 rounds (generate verifies)."""
    assert len(generate(n).rounds) == n + n.bit_length() - 3 == lower_bound(n)


@pytest.mark.slow
def test_every_even_n_up_to_256_verifies():
    """``generate`` replays each schedule in ``verify`` before returning it;
    here the round counts must also respect the lower bound."""
    for n in EVEN:
        rounds = len(generate(n).rounds)
        assert rounds >= lower_bound(n), n


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 7, 8, 10, 16])
def test_any_straggler_rank(n):
    for straggler in range(n):
        schedule = generate(n, straggler)
        assert schedule.straggler == straggler
        # Round 0: the first non-straggler and the straggler reduce chunk 0.
        assert {(t.src, t.dst, t.chunk, t.reduce) for t in schedule.rounds[0][:2]} == {
            (schedule.owner(0), straggler, 0, True), (straggler, schedule.owner(0), 0, True)}


def test_odd_n_gives_valid_schedules_through_the_greedy():
    for n in range(3, 40, 2):
        assert len(generate(n).rounds) >= lower_bound(n)


def test_the_power_of_two_construction_only_claims_powers_of_two():
    for n in (4, 8, 32):
        verify(Schedule(n, n - 1, power_of_two_rounds(n)))
        verify(Schedule(n, n - 1, deadline_rounds(n)))
    with pytest.raises(AssertionError, match="invariant"):
        power_of_two_rounds(12)


def test_json_round_trip():
    schedule = generate(12, 5)
    assert Schedule.from_json(schedule.to_json()) == schedule


@pytest.mark.parametrize("kwargs, message", [
    (dict(n=1), "n must be an int >= 2"),
    (dict(n=8.0), "n must be an int >= 2"),
    (dict(n=True), "n must be an int >= 2"),
    (dict(n=8, straggler=8), r"straggler must be a rank in range\(8\)"),
    (dict(n=8, straggler=-1), r"straggler must be a rank in range\(8\)"),
])
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        generate(**kwargs)


def test_the_round_counts_the_readme_reports_for_small_n():
    """Excess over the lower bound: none at 6 and 10, one round at 12 and 14."""
    excess = {n: len(generate(n).rounds) - lower_bound(n) for n in (6, 10, 12, 14)}
    assert excess == {6: 0, 10: 0, 12: 1, 14: 1}
    assert len(deadline_rounds(10)) == 13 > len(generate(10).rounds)
