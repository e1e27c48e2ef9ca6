"""A run's figures from its datasets: throughput, accuracy, stale fraction, stragglers, membership changes."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike

from .schema import LATER_STEP_FIELDS, NOTICED

if TYPE_CHECKING:
    from .reader import Run

__all__ = ["last_epoch_accuracy", "membership_summary", "straggler_summary", "summarize"]


def straggler_summary(rows: ArrayLike) -> dict[str, float | int]:
    """The straggler predictor's record from table ``sync/stragglers``:
    ``stragglar_fraction`` (global synchronizations run as StragglAR, with a
    predicted straggler), ``straggler_hit_rate`` (of those, the ones whose
    predicted rank arrived last; NaN with none), and the counts
    ``straggler_syncs``, ``straggler_predictions`` and ``straggler_hits``."""
    rows = np.asarray(rows)
    predicted = rows[:, 1] >= 0
    hits = predicted & (rows[:, 1] == rows[:, 2])
    return {
        "stragglar_fraction": float(predicted.mean()),
        "straggler_hit_rate": float(hits.sum() / predicted.sum()) if predicted.any() else math.nan,
        "straggler_syncs": int(rows.shape[0]),
        "straggler_predictions": int(predicted.sum()),
        "straggler_hits": int(hits.sum()),
    }


def membership_summary(membership: Mapping[str, ArrayLike]) -> dict[str, float | int]:
    """The membership changes of ``membership/`` (one row per rank that
    left or joined; a change is the rows of one step and clock):
    ``membership_changes``, ``ranks_left`` (the rows that left, counting
    each once), ``ranks_joined`` (the replacements admitted) and
    ``recovery_s``, the seconds from noticing a change to going on, summed
    over the changes."""
    events = np.unique(np.column_stack([membership["step"], membership["clock"], membership["recovery_s"]]), axis=0)
    noticed, left = np.asarray(membership["noticed"]), np.asarray(membership["left"])
    departures = ~np.isin(noticed, [NOTICED["joined"], NOTICED["refused"]])
    return {
        "membership_changes": int(len(events)),
        "ranks_left": int(len(np.unique(left[departures]))),
        "ranks_joined": int((noticed == NOTICED["joined"]).sum()),
        "recovery_s": float(events[:, 2].sum()),
    }


def summarize(run: Run, skip: int = 0) -> dict[str, Any]:
    """Throughput and accuracy figures of a run, from its datasets.

    Throughput counts every rank's samples (``steps/samples``: skipped
    steps and a dead rank's missing ones count none) of steps ``skip .. written - 1``
    over the time from the latest rank's end of step ``skip - 1`` (the run's
    start when ``skip`` is 0) to the latest rank's end of the last step, on
    the training clock: what a user waits for, evaluation excluded.
    ``bytes_sent_per_rank``, where the run counted its bytes, is the
    ranks' mean of the bytes each sent to average over the whole run.
    """
    clock = run.steps["clock"]
    written = clock.shape[1]
    samples = run.steps.get("samples")
    if samples is None:  # a run made in memory (the simulator) without the field
        samples = np.full_like(clock, LATER_STEP_FIELDS["samples"](run.attrs))
    out = {"steps": written, "samples": float(np.nansum(samples))}
    if written > skip:
        start = float(np.nanmax(clock[:, skip - 1])) if skip else 0.0
        elapsed = float(np.nanmax(clock[:, -1])) - start
        out["train_time"] = float(np.nanmax(clock[:, -1]))
        if elapsed > 0:
            out["steps_per_second"] = (written - skip) / elapsed
            out["throughput"] = float(np.nansum(samples[:, skip:])) / elapsed
        out["mean_wait_time"] = float(np.nanmean(run.steps["wait_time"]))
        out["stale_fraction"] = float(np.nanmean(run.steps["stale"]))
        sent = run.steps.get("bytes_sent")
        if sent is not None and np.isfinite(sent).any():
            # Per rank: the ranks' mean of what each sent over the whole run.
            out["bytes_sent_per_rank"] = float(np.nansum(sent) / sent.shape[0])
    stragglers = run.tables.get("stragglers")
    if stragglers is not None and len(stragglers):
        out.update(straggler_summary(stragglers))
    if len(run.membership.get("left", ())):
        out.update(membership_summary(run.membership))
    accuracy = run.eval.get("accuracy", np.zeros(0))
    if accuracy.size and np.any(np.isfinite(accuracy)):
        out["final_accuracy"] = float(accuracy[-1])
        out["best_accuracy"] = float(np.nanmax(accuracy))
        out["last_epoch_accuracy"] = last_epoch_accuracy(run)
    return out


def last_epoch_accuracy(run: Run) -> float:
    """The mean accuracy of the evaluations of the last epoch trained: those
    whose epoch lies within one epoch of the last evaluation's, that one
    included (NaN ones left out).  A final evaluation alone decides a
    comparison by one noisy snapshot; with several evaluations an epoch
    (``experiments.train --eval-every 0.25``) this is their mean.  Evaluated
    once an epoch, it is the final accuracy."""
    accuracy = np.asarray(run.eval["accuracy"], dtype=np.float64)
    epoch = np.asarray(run.eval["epoch"], dtype=np.float64)
    last = epoch > epoch[-1] - 1 + 1e-9
    return float(np.nanmean(accuracy[last]))
