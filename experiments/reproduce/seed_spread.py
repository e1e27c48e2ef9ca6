"""Accuracy over seeds: each variant's mean and range, and when a gap between two counts."""

import dataclasses

import numpy as np

from wagma.results import last_epoch_accuracy, summarize

__all__ = ["DIVERGED_BELOW", "SeedSpread", "gap_counts", "spread_of"]

#: A seed *diverged* when its last epoch's accuracy fell below this fraction of
#: its best evaluation: it learned, then lost what it had learned (its loss back
#: at chance's), as replicas stepping alone at a learning rate set for the
#: global batch can.
DIVERGED_BELOW = 0.5


@dataclasses.dataclass(frozen=True)
class SeedSpread:
    """One variant's accuracies over its seeds, in percent.

    ``last_epoch`` (the mean of the last epoch's evaluations,
    :func:`wagma.results.last_epoch_accuracy`) is what the verdicts compare:
    several evaluations, so less noise than the final one alone, which is
    reported beside it.  The *spread* is the range over the seeds (largest
    minus smallest).  ``best`` is each seed's best evaluation, against
    which :attr:`diverged` counts the seeds that learned and then lost it;
    ``label`` names the variant in the rows.
    """

    seeds: tuple
    final: tuple
    last_epoch: tuple
    stale: float
    best: tuple = ()
    label: str = ""

    @property
    def diverged(self) -> int:
        """How many seeds ended below :data:`DIVERGED_BELOW` of their best evaluation."""
        return sum(last < DIVERGED_BELOW * best for last, best in zip(self.last_epoch, self.best))

    @property
    def mean(self) -> float:
        return float(np.mean(self.last_epoch))

    @property
    def spread(self) -> float:
        return float(np.ptp(self.last_epoch))

    @property
    def final_mean(self) -> float:
        return float(np.mean(self.final))

    @property
    def final_spread(self) -> float:
        return float(np.ptp(self.final))

    def text(self) -> str:
        """``"81.2 +- 1.3 (final 80.9 +- 2.0; 3 seeds)"``: the means and half the ranges."""
        return (
            f"{self.mean:.1f} +- {self.spread / 2:.1f} (final {self.final_mean:.1f} +- "
            f"{self.final_spread / 2:.1f}; {len(self.seeds)} seeds)"
        )


def spread_of(runs: dict, label: str = "") -> SeedSpread:
    """The :class:`SeedSpread` of ``{seed: run}``, named ``label``."""
    seeds = tuple(sorted(runs))
    summaries = [summarize(runs[s]) for s in seeds]
    return SeedSpread(
        seeds,
        tuple(100 * summary["final_accuracy"] for summary in summaries),
        tuple(100 * last_epoch_accuracy(runs[s]) for s in seeds),
        float(np.mean([summary["stale_fraction"] for summary in summaries])),
        tuple(100 * float(np.nanmax(runs[s].eval["accuracy"])) for s in seeds),
        label,
    )


def gap_counts(a: SeedSpread, b: SeedSpread) -> tuple[float, float, bool]:
    """``(gap, noise, counts)``: a's mean minus b's, the larger of their
    spreads, and whether the gap exceeds it.  A gap within the spread of
    either variant could be the seeds' doing: it does not order them."""
    gap, noise = a.mean - b.mean, max(a.spread, b.spread)
    return gap, noise, abs(gap) > noise
