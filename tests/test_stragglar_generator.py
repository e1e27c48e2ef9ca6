"""The StragglAR schedule generator: every schedule verified, round counts, arguments."""

import pytest

from collectives.stragglar import Schedule, generate, lower_bound, verify
from collectives.stragglar.generator import plan

EVEN = range(2, 257, 2)


def test_lower_bound_formula():
    assert [lower_bound(n) for n in (2, 4, 6, 8, 12, 14, 256)] == [1, 4, 7, 9, 14, 16, 262]


@pytest.mark.parametrize("n", [n for n in EVEN if n & (n - 1) == 0] + [512, 1024])
def test_power_of_two_is_algorithm_1_at_the_lower_bound(n):
    rounds, method = plan(n)
    assert method == "Algorithm 1"
    assert len(rounds) == n + n.bit_length() - 3 == lower_bound(n)
    if n <= 256:
        verify(generate(n))


def test_every_even_n_up_to_256_verifies_at_the_lower_bound():
    for n in EVEN:
        schedule = verify(generate(n))
        assert len(schedule.rounds) == lower_bound(n), n


def test_odd_n_verify_at_the_lower_bound():
    for n in range(3, 42, 2):
        assert len(verify(generate(n)).rounds) == lower_bound(n), n


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 7, 8, 10, 16])
def test_any_straggler_rank(n):
    for straggler in range(n):
        schedule = verify(generate(n, straggler))
        assert schedule.straggler == straggler
        # Round 0: the first non-straggler and the straggler reduce chunk 0.
        assert {(t.src, t.dst, t.chunk, t.reduce) for t in schedule.rounds[0][:2]} == {
            (schedule.owner(0), straggler, 0, True),
            (straggler, schedule.owner(0), 0, True),
        }


def test_json_round_trip():
    schedule = generate(12, 5)
    assert Schedule.from_json(schedule.to_json()) == schedule


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(n=1), "n must be an int >= 2"),
        (dict(n=8.0), "n must be an int >= 2"),
        (dict(n=True), "n must be an int >= 2"),
        (dict(n=8, straggler=8), r"straggler must be a rank in range\(8\)"),
        (dict(n=8, straggler=-1), r"straggler must be a rank in range\(8\)"),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        generate(**kwargs)
