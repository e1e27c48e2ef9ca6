"""Work reallocation (EnsembleSync, Lemma 1): each rank's share of a fixed global batch, from its measured speed.

The paper (section 3.2) allocates a resource x_i (GPU memory) to worker i
under a budget sum_i x_i = B, models worker i's time between two
synchronizations as t_i = alpha_i / x_i, and proves (Lemma 1) that
min_x max_i t_i is reached when all t_i are equal, which gives
x_i = B alpha_i / sum_j alpha_j.  The lemma needs only that every f_i is
monotone.

Here the resource is the work itself: x_i is rank i's share of the samples
of one step, and the fixed global batch B = (ranks) x (--batch-size) is the
budget, so the number of samples per step, and the meaning of an epoch,
stay those of the run without reallocation.  A rank's time for a period is
then t_i = x_i / v_i, increasing in x_i, where v_i is its speed in samples
per second; Lemma 1 applies with f_i(x) = x / v_i and equal times give

    x_i = B v_i / sum_j v_j,

the paper's formula with alpha_i = v_i: **alpha_i is rank i's measured
speed, the samples it processed in the last period divided by the seconds
its steps took (compute, injected delays and slow faults included,
waiting at the synchronization excluded)**.  The paper estimates alpha_i
from the last epoch's time in the same way.

Shares are whole samples, summing to B exactly, with the smallest makespan
among whole allocations (the real x_i rounded down, then the samples left
one by one to the rank that would finish its next one first), and every
living rank keeps at least ``floor`` samples so that its speed stays
measurable (a rank given 0
samples would never be timed again and never get work back).  Ranks that
are absent (dead, or late for the synchronization) get 0, their share goes
to the others; a rank that comes back is given its last known speed.
"""

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["lemma1_shares", "Reallocation", "speeds_problem"]


def speeds_problem(global_batch: object, speeds: ArrayLike, floor: int) -> str | None:
    """The first problem with :func:`lemma1_shares`' arguments, or None."""
    if isinstance(global_batch, bool) or not isinstance(global_batch, (int, np.integer)) or global_batch < 1:
        return f"global_batch must be an int >= 1, got {global_batch!r}"
    speeds = np.asarray(speeds, dtype=float)
    if speeds.ndim != 1 or not np.all(np.isfinite(speeds)) or np.any(speeds < 0):
        return f"speeds must be finite and >= 0 (0 = absent), got {speeds.tolist()}"
    alive = int(np.count_nonzero(speeds))
    if alive == 0:
        return "at least one rank must have a speed above 0"
    if alive * floor > global_batch:
        return f"{alive} ranks with at least {floor} samples each exceed the global batch {global_batch}"
    return None


def lemma1_shares(global_batch: int, speeds: ArrayLike, floor: int = 1) -> np.ndarray:
    """Samples per step for each rank: B v_i / sum_j v_j in whole samples.

    Args:
        global_batch: B, the samples of one step over all ranks.
        speeds: v_i per rank, samples per second; 0 for a rank that gets
            no work (absent).
        floor: the fewest samples a rank with a speed above 0 gets.

    Returns:
        int64 shares, summing to ``global_batch``; 0 exactly where the speed
        is 0.  Equal speeds give equal shares (up to one sample of
        rounding); no other whole allocation has a smaller max_i x_i / v_i.

    Raises:
        ValueError: a non-positive budget, a negative or non-finite speed,
            no rank with a speed, or a floor the budget cannot pay.
    """
    problem = speeds_problem(global_batch, speeds, floor)
    if problem:
        raise ValueError(problem)
    speeds = np.asarray(speeds, dtype=float)
    alive = speeds > 0

    def shares_at(t):  # the most samples each rank finishes within time t, at least the floor
        return np.where(alive, np.maximum(floor, np.floor(t * speeds)), 0).astype(np.int64)

    # The largest common time t whose shares fit the budget (bisection; at
    # t = B / sum v they fit, being the floors of Lemma 1's x_i, unless
    # floors lift some), then the remaining samples one at a time to the rank
    # that would finish its next one soonest: the integer allocation with
    # the smallest makespan max_i x_i / v_i.
    low, high = 0.0, global_batch / speeds[alive].min() + 1.0
    for _ in range(100):
        middle = (low + high) / 2
        low, high = (middle, high) if shares_at(middle).sum() <= global_batch else (low, middle)
    shares = shares_at(low)
    next_time = np.where(alive, (shares + 1) / np.where(alive, speeds, 1.0), np.inf)
    for _ in range(global_batch - int(shares.sum())):
        i = int(np.argmin(next_time))
        shares[i] += 1
        next_time[i] = (shares[i] + 1) / speeds[i]
    return shares


class Reallocation:
    """The reallocation policy of a run: shares for the next period from the last one's measurements.

    Every rank holds the same instance state: :meth:`update` is pure and
    every rank calls it with the same (gathered) measurements, so the shares
    agree without another message.

    Args:
        ranks: the run's ranks.
        batch_size: the per-rank batch without reallocation; the global
            batch is ``ranks * batch_size``.
        floor: the fewest samples per step of a living rank.
    """

    def __init__(self, ranks: int, batch_size: int, floor: int = 1) -> None:
        self.ranks, self.global_batch, self.floor = ranks, ranks * batch_size, floor
        self.shares = np.full(ranks, batch_size, dtype=np.int64)
        self.speeds = np.zeros(ranks)  # the last measured speed of each rank

    def update(self, samples: ArrayLike, seconds: ArrayLike, present: ArrayLike | None = None) -> np.ndarray:
        """New shares from one period: ``samples[i]`` processed by rank i in
        ``seconds[i]`` of its own step time; ``present`` marks the ranks
        that take part in the next period (default: all).  A present rank
        without a measurement (``seconds`` 0) keeps its last known speed,
        or the mean of the others' when it has none."""
        samples, seconds = np.asarray(samples, float), np.asarray(seconds, float)
        present = np.ones(self.ranks, bool) if present is None else np.asarray(present, bool)
        measured = (seconds > 0) & (samples > 0)
        self.speeds[measured] = samples[measured] / seconds[measured]
        speeds = np.where(present, self.speeds, 0.0)
        known = speeds > 0
        if not known.any():
            return self.shares
        speeds[present & ~known] = speeds[known].mean()
        self.shares = lemma1_shares(self.global_batch, speeds, self.floor)
        return self.shares
