"""Online prediction of the rank that will arrive last at the next global synchronization.

StragglAR (Devraj et al.) hides a straggler's delay behind a ReduceScatter
of the others, but needs to know the straggler before the collective starts
(its paper takes it as given).  This module predicts it from what the
framework already sees: each rank's *arrival* at every past synchronization.

Arrival is measured on each rank's own clock as the seconds between leaving
the previous synchronization and entering this one (the rank's work in
between: compute, injected delays, group averaging and any waiting in
it).  A blocking allreduce
releases all ranks within a few message latencies of one another, so these
local durations order the ranks as a common clock would, and no clock needs
to be synchronised across nodes.

The rule (:func:`update_scores`, :func:`predicted_rank`): a decayed
frequency of being last, gated by a decayed lead.  After synchronization k
with arrivals ``a``:

* ``last = argmax a``, ``lead = a[last] - max_{r != last} a[r]`` (how long
  every other rank waited for the last one alone);
* ``frequency[r] <- (1 - decay) frequency[r] + decay [r == last]``;
* ``lead_seconds[r] <- (1 - decay) lead_seconds[r] + decay lead [r == last]``
  (every rank's lead decays at every synchronization, so that one long
  stall - a checkpoint, a flush - does not keep a rank above the gate).

The prediction for synchronization k + 1 is ``p = argmax frequency``
(lowest rank on a tie), *confident* when ``frequency[p] >= confidence``
and ``lead_seconds[p] >= min_lead_s``; otherwise there is no prediction.

Why a frequency and not a decayed average of arrival times: an average is
moved by one large delay for many synchronizations (a rank that stalled
1 s once would be "predicted" long after), and it cannot tell a rank that
is always a little late from one that is sometimes very late.  Being last
is what StragglAR needs; the lead says whether its ReduceScatter can hide.
With the defaults (decay 1/4, confidence 1/2) a persistent straggler is
predicted from its fourth synchronization on (frequency 0.25, 0.44, 0.58
after the first three); when the late rank switches, the switch's own
synchronization and the next two are planned for the old one (three
misses), the new one from the fourth; when nobody is persistently late (k
of P ranks drawn at random each step), a rank must be last at about three
of four synchronizations running to be predicted: under the WAGMA paper's
random-k at P = 8 that happens at 6 to 9 % of the synchronizations,
right 1 time in 8, as chance has it.  The lead gate removes those: two
ranks late by the same delay lead each other by jitter only
(:mod:`collectives.stragglar.training_sync` sets ``min_lead_s``).

Agreement without a round trip: every rank feeds the same arrival vector
(an allgather overlapped with the synchronization itself, see
:mod:`collectives.stragglar.training_sync`) to the same deterministic arithmetic, so
every rank holds the same prediction without exchanging it.

:func:`update_scores` and :func:`predicted_rank` touch only numpy arrays
and floats, so the simulator compiles the same two functions with numba
(:mod:`wagma.sim.kernels`).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["StragglerPredictor", "predicted_rank", "predictor_problem", "update_scores"]


def update_scores(
    frequency: np.ndarray, lead_seconds: np.ndarray, arrivals: np.ndarray, decay: float
) -> tuple[int, float]:
    """Fold one synchronization's ``arrivals`` (seconds per rank) into the
    scores, in place; returns ``(last, lead)`` of this synchronization."""
    last = 0
    for r in range(arrivals.size):
        if arrivals[r] > arrivals[last]:
            last = r
    second = -np.inf
    for r in range(arrivals.size):
        if r != last and arrivals[r] > second:
            second = arrivals[r]
    lead = arrivals[last] - second if arrivals.size > 1 else 0.0
    for r in range(frequency.size):
        frequency[r] *= 1.0 - decay
        lead_seconds[r] *= 1.0 - decay
    frequency[last] += decay
    lead_seconds[last] += decay * lead
    return last, lead


def predicted_rank(frequency: np.ndarray, lead_seconds: np.ndarray, confidence: float, min_lead_s: float) -> int:
    """The confident prediction for the next synchronization, or -1."""
    p = 0
    for r in range(frequency.size):
        if frequency[r] > frequency[p]:
            p = r
    if frequency[p] >= confidence and lead_seconds[p] >= min_lead_s:
        return p
    return -1


class StragglerPredictor:
    """The rule of this module over a run's synchronizations, with its record.

    Args:
        ranks: P, the length of every arrival vector.
        decay: weight of the newest synchronization, in (0, 1].
        confidence: the frequency of being last from which the most
            frequent rank is predicted, in (0, 1].
        min_lead_s: the decayed lead (seconds) it must also have, >= 0:
            a rank that is last by less than the ReduceScatter of the
            others takes is not worth planning for.

    Attributes:
        straggler: the prediction for the next synchronization (a rank) or
            None when no rank is predicted with confidence.
        observed: synchronizations folded in.
        predicted: of them, those that had a prediction.
        hits: of those, the ones whose predicted rank did arrive last.
    """

    def __init__(self, ranks: int, *, decay: float = 0.25, confidence: float = 0.5, min_lead_s: float = 0.0) -> None:
        problem = predictor_problem(ranks, decay, confidence, min_lead_s)
        if problem:
            raise ValueError(problem)
        self.ranks, self.decay, self.confidence, self.min_lead_s = ranks, decay, confidence, min_lead_s
        self.frequency = np.zeros(ranks)
        self.lead_seconds = np.zeros(ranks)
        self.straggler: int | None = None
        self.observed = self.predicted = self.hits = 0

    def observe(self, arrivals: ArrayLike) -> tuple[int, int, float]:
        """Fold in one synchronization; returns ``(predicted, last, lead)``
        where ``predicted`` is the prediction it was run with (-1: none)."""
        arrivals = np.asarray(arrivals, dtype=np.float64)
        if arrivals.shape != (self.ranks,) or not np.all(np.isfinite(arrivals)):
            raise ValueError(f"arrivals must be {self.ranks} finite seconds, got {arrivals!r}")
        before = -1 if self.straggler is None else self.straggler
        last, lead = update_scores(self.frequency, self.lead_seconds, arrivals, self.decay)
        self.observed += 1
        if before >= 0:
            self.predicted += 1
            self.hits += int(before == last)
        p = predicted_rank(self.frequency, self.lead_seconds, self.confidence, self.min_lead_s)
        self.straggler = None if p < 0 else int(p)
        return before, int(last), float(lead)

    @property
    def hit_rate(self) -> float:
        """Hits over synchronizations run with a prediction (NaN before any)."""
        return self.hits / self.predicted if self.predicted else float("nan")

    def __repr__(self) -> str:
        return (
            f"StragglerPredictor(P={self.ranks}, straggler={self.straggler}, "
            f"{self.hits}/{self.predicted} hits over {self.observed} synchronizations)"
        )


def predictor_problem(ranks: object, decay: object, confidence: object, min_lead_s: object) -> str | None:
    """The first bad argument of :class:`StragglerPredictor` as a sentence, or None."""
    if isinstance(ranks, bool) or not isinstance(ranks, (int, np.integer)) or ranks < 1:
        return f"ranks must be an int >= 1, got {ranks!r}"
    for name, value in (("decay", decay), ("confidence", confidence)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
            return f"{name} must be a number in (0, 1], got {value!r}"
    if isinstance(min_lead_s, bool) or not isinstance(min_lead_s, (int, float)) or not min_lead_s >= 0:
        return f"min_lead_s must be a number >= 0, got {min_lead_s!r}"
    return None
