"""Runs with injected faults (EnsembleSync's Figures 4 and 5 in kind): time against epoch, the samples'
allocation, what each outage cost."""

import json
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from wagma.results import Run

from .plots import _grid, _panel, _pyplot, _save

__all__ = ["format_outage_table", "outage_row", "plot_allocation", "plot_time_vs_epoch"]


def _faulty_ranks(run: Run) -> set:
    return {fault["rank"] for fault in json.loads(run.attrs.get("faults", "[]"))}


def _epochs(run: Run) -> np.ndarray:
    per_epoch = max(int(run.attrs.get("steps_per_epoch", 0)), 1)
    return (np.arange(run.steps["clock"].shape[1]) + 1) / per_epoch


def outage_row(run: Run, scenario: str, fault_free: Run | None = None) -> dict[str, Any]:
    """What a fault cost one run.

    ``others_longest_wait_s``: over the ranks no fault was injected into, the
    longest step minus their median step: how long they stood still at once
    (Sync SGD: the outage; ensemble_sync: about one timeout).  ``time_lost_s``:
    the run's training time (the latest rank's clock at its last step) minus
    the fault-free run's, when both completed.  ``epochs`` is how far the run
    got (less than planned where the job ended at a death)."""
    steps, clock = run.steps, run.steps["clock"]
    others = [r for r in range(clock.shape[0]) if r not in _faulty_ranks(run)]
    step_time = steps["step_time"][others]
    done = int(np.isfinite(clock[others]).all(axis=0).sum())
    train_time = float(np.nanmax(clock[others])) if clock.size else float("nan")
    row = {
        "scenario": scenario,
        "algorithm": str(run.attrs["algorithm"]),
        "status": str(run.attrs["status"]),
        "epochs": done / max(int(run.attrs.get("steps_per_epoch", 0)), 1),
        "train_time_s": train_time,
        "others_longest_wait_s": float(np.nanmax(step_time) - np.nanmedian(step_time)) if done else float("nan"),
        "time_lost_s": None,
        "dead_ranks": json.loads(run.attrs.get("dead_ranks", "[]")),
        "skipped_steps": int(np.nansum(steps["skipped"])),
    }
    if fault_free is not None and row["status"] == "complete" and fault_free.attrs["status"] == "complete":
        row["time_lost_s"] = train_time - float(np.nanmax(fault_free.steps["clock"]))
    return row


def format_outage_table(rows: Iterable[Mapping[str, Any]]) -> str:
    """A markdown table of :func:`outage_row` rows."""
    lines = [
        "| scenario | algorithm | status | epochs | training time (s) | longest wait of the others (s) "
        "| time lost to the fault (s) | skipped steps | dead ranks |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lost = "-" if r["time_lost_s"] is None else f"{r['time_lost_s']:.2f}"
        lines.append(
            f"| {r['scenario']} | {r['algorithm']} | {r['status']} | {r['epochs']:.1f} "
            f"| {r['train_time_s']:.2f} | {r['others_longest_wait_s']:.2f} | {lost} "
            f"| {r['skipped_steps']} | {', '.join(map(str, r['dead_ranks'])) or '-'} |"
        )
    return "\n".join(lines) + "\n"


def _per_rank_panels(runs, field, ylabel, title, path, label_of):
    """One panel per run (``{label: Run}``): each rank's ``steps/field``
    against its epoch, the faulty ranks drawn thicker."""
    plt = _pyplot()
    fig, axes = _grid(plt, len(runs))
    for ax, (label, run) in zip(axes, runs.items()):
        epochs, faulty = _epochs(run), _faulty_ranks(run)
        for rank, values in enumerate(run.steps[field]):
            ax.plot(
                epochs,
                values,
                label=f"rank {rank}{' (fault)' if rank in faulty else ''}",
                linewidth=2.0 if rank in faulty else 1.0,
            )
        _panel(ax, label_of(label, run), "epoch", ylabel)
    return _save(plt, fig, title, path)


def _ended(label, run):
    status = str(run.attrs["status"])
    return label if status == "complete" else f"{label}: the job ended (file {status})"


def plot_time_vs_epoch(runs: dict, title: str, path: str) -> str:
    """Each rank's training clock against its epoch, a panel per run
    (``{label: Run}``; the paper's Figure 4: execution time vs epoch, one
    line per worker); a stopped rank's line is flat, a rank that skips
    forward jumps right, a dead rank's line ends."""
    return _per_rank_panels(runs, "clock", "training time (s)", title, path, _ended)


def plot_allocation(runs: dict, title: str, path: str) -> str:
    """Each rank's samples per step against the epoch, a panel per run (the
    paper's Figure 5, right: the allocation moves to the fast ranks while
    one is slow, and to the survivors after a death)."""
    return _per_rank_panels(runs, "samples", "samples per step", title, path, lambda label, run: label)
