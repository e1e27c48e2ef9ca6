"""Accuracy over repeated runs: each variant's mean and spread across seeds and repeats."""

import numpy as np

from .table import render

__all__ = ["SPREAD_COLUMNS", "format_spread", "spread_rows"]

#: The headers of :func:`format_spread`.
SPREAD_COLUMNS = ("algorithm", "P", "runs", "final %", "final mean", "last-epoch %", "last-epoch mean", "stale")


def _stats(values):
    values = np.asarray([v for v in values if v is not None], dtype=np.float64)
    if not values.size:
        return None
    return float(values.min()), float(values.max()), float(values.mean())


def spread_rows(rows: list[dict]) -> list[dict]:
    """One row per variant (run label) and P from :func:`~wagma.analysis.table.compare`'s
    rows of repeated runs: ``runs``, and the (min, max, mean) over them of
    ``final_accuracy``, ``last_epoch_accuracy`` and ``stale_fraction``
    (None where no run has one), in the order the variants first appear."""
    groups: dict[tuple[str, int], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["label"], row["ranks"]), []).append(row)
    return [
        {
            "label": label,
            "ranks": ranks,
            "runs": len(members),
            **{
                field: _stats(r[field] for r in members)
                for field in ("final_accuracy", "last_epoch_accuracy", "stale_fraction")
            },
        }
        for (label, ranks), members in groups.items()
    ]


def _range(stats, scale=100.0, spec=".1f"):
    return "-" if stats is None else f"{stats[0] * scale:{spec}}-{stats[1] * scale:{spec}}"


def _mean(stats, scale=100.0, spec=".1f"):
    return "-" if stats is None else f"{stats[2] * scale:{spec}}"


def format_spread(rows: list[dict], markdown: bool = False) -> str:
    """:func:`spread_rows` as a table: accuracies in percent, their range
    (min-max) and mean over the runs, and the mean stale fraction."""
    cells = [list(SPREAD_COLUMNS)]
    cells += [
        [
            r["label"],
            str(r["ranks"]),
            str(r["runs"]),
            _range(r["final_accuracy"]),
            _mean(r["final_accuracy"]),
            _range(r["last_epoch_accuracy"]),
            _mean(r["last_epoch_accuracy"]),
            _mean(r["stale_fraction"], 1.0, ".2f"),
        ]
        for r in rows
    ]
    return render(cells, ["<", ">", ">", ">", ">", ">", ">", ">"], markdown)
