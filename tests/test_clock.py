"""The training clock: evaluations and checkpoints are off the clock, and its readings never go back."""

import time

import pytest

from wagma.clock import TrainingClock


def _busy(seconds):
    """Real work for ``seconds`` (what a slow evaluation is to the clock)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


# Float rounding of the clock's sums of perf_counter readings.
ROUNDING = 1e-9


@pytest.mark.timing
def test_clock_stands_still_while_paused():
    clock = TrainingClock()
    _busy(0.01)
    clock.pause()
    at_pause = clock()
    _busy(0.05)
    assert clock() == at_pause  # exactly: a paused clock reads its value at the pause
    before = time.perf_counter()
    clock.resume()
    resumed = clock()
    after = time.perf_counter()
    # Resuming continues from the pause's value: the 50 ms of the pause are not on
    # the clock, only what passed between the resume and the reading.
    assert at_pause <= resumed <= at_pause + (after - before) + ROUNDING


@pytest.mark.timing
def test_slow_first_evaluation_cannot_make_a_later_stamp_earlier():
    """The failure this clock was written for: a slow first evaluation (warm-up, a wait for
    a peer) followed by a short epoch.  Evaluations are stamped with the clock read while
    paused, as experiments.train does; the stamps must increase."""
    start = time.perf_counter()
    clock = TrainingClock()
    stamps, evaluations = [], 0.0
    for train_s, eval_s in [(0.01, 0.15), (0.01, 0.0), (0.01, 0.0)]:
        _busy(train_s)
        clock.pause()
        evaluation = time.perf_counter()
        _busy(eval_s)
        stamps.append(clock())
        evaluations += time.perf_counter() - evaluation  # inside the pause
        clock.resume()
    assert stamps == sorted(stamps) and len(set(stamps)) == 3, stamps
    # Only the training is on the clock: 3 x 10 ms and what surrounds it, never
    # the time spent inside the pauses (the 150 ms evaluation among it).
    assert 0.03 <= clock() <= time.perf_counter() - start - evaluations + ROUNDING


@pytest.mark.timing
def test_offset_continues_a_resumed_run():
    before = time.perf_counter()
    clock = TrainingClock(offset=12.5)
    reading = clock()
    assert 12.5 <= reading <= 12.5 + (time.perf_counter() - before) + ROUNDING


def test_pause_and_resume_must_alternate():
    clock = TrainingClock()
    with pytest.raises(RuntimeError, match="not paused"):
        clock.resume()
    clock.pause()
    with pytest.raises(RuntimeError, match="already paused"):
        clock.pause()
