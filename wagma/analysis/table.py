"""One comparison row per run: throughput, speedup over a baseline, accuracy, waiting."""

import csv
import math
import os
from collections.abc import Iterable
from typing import Any

import numpy as np

from wagma.options.algorithms import EAGER_LIMITER
from wagma.results import Run, load_run, summarize

from .files import is_partial

__all__ = [
    "COLUMNS",
    "ROW_FIELDS",
    "baseline_key",
    "compare",
    "format_table",
    "mean_throughput",
    "render",
    "run_label",
    "time_to_accuracy",
    "write_csv",
]

#: The keys of a :func:`compare` row, in CSV order.  Values are in the run
#: file's units (seconds, accuracy as a fraction); None where there is none.
ROW_FIELDS = (
    "file",
    "algorithm",
    "label",
    "ranks",
    "group_size",
    "tau",
    "imbalance",
    "compute",
    "model",
    "dataset",
    "batch_size",
    "status",
    "file_status",
    "steps",
    "steps_planned",
    "skip",
    "throughput",
    "baseline",
    "speedup",
    "final_accuracy",
    "last_epoch_accuracy",
    "best_accuracy",
    "target_accuracy",
    "time_to_target",
    "mean_wait_time",
    "stale_fraction",
)


def _options(run: Run) -> dict:
    """The algorithm's options a run file records: ``algorithm_options`` of
    a measured run's config, ``options`` of a simulated one's; {} if none."""
    try:
        config = run.config
    except ValueError:  # not JSON: an old or hand-made file
        return {}
    options = config.get("algorithm_options", config.get("options")) if isinstance(config, dict) else None
    return options if isinstance(options, dict) else {}


def run_label(run: Run) -> str:
    """The run's algorithm and, in the paper's words, the options that make
    it a variant: ``sgp (1n)`` / ``sgp (2n)`` (SGP's out-peers, as the WAGMA
    paper writes "SGP (1n)"), ``wagma (fixed groups)`` (ablation 2),
    ``wagma (group averaging)`` (beta instead of alpha) or ``wagma (no group
    collectives)`` (both off: ablation 1's local SGD with tau), ``eager_sgd
    (solo)`` or ``(half)`` and eager-SGD's late reading and limiter where
    they are not the defaults (``eager_sgd (half, accumulate)``,
    ``eager_sgd (solo, limiter 0)``), and ``stragglar sync`` / ``reallocate`` for any algorithm run
    with them; several join with commas inside one parenthesis.  Options
    at their defaults add nothing (SGP's peers excepted), nor does a tau or
    S, which have columns of their own; a file that records no options is
    named by its algorithm alone."""
    algorithm = str(run.attrs.get("algorithm", "?"))
    options = _options(run)
    parts = []
    if algorithm == "sgp" and options.get("peers") is not None:
        parts.append(f"{options['peers']}n")
    if algorithm == "wagma":
        if options.get("wait_avoiding") is False:
            parts.append("group averaging" if options.get("group_averaging") else "no group collectives")
        if options.get("fixed_groups"):
            parts.append("fixed groups")
    if algorithm == "eager_sgd":
        parts += _eager_variant(options)
    if algorithm == "streaming_diloco" and "fragments" in options:
        parts.append(f"{options['fragments']} fragments, overlap {options.get('overlap_steps', 1)}")
    if algorithm in ("local_sgd", "wagma") and (options.get("outer_lr", 1.0), options.get("outer_momentum", 0.0)) != (
        1.0,
        0.0,
    ):
        parts.append(f"outer lr {options['outer_lr']:g}, momentum {options['outer_momentum']:g}")
    if options.get("compression", "none") != "none":
        parts.append(str(options["compression"]))
    if options.get("sync") == "stragglar":
        parts.append("stragglar sync")
    if options.get("reallocate"):
        parts.append("reallocate")
    return f"{algorithm} ({', '.join(parts)})" if parts else algorithm


def _eager_variant(options: dict) -> list[str]:
    """Eager-SGD's options that are not its defaults, in a label's words.
    Files written before the late reading and the limiter were options
    record neither; they carried late gradients over (``accumulate``) and
    had no limiter, and their majority was the first ceil(P/2) arrivals."""
    quorum = options.get("quorum", "majority")
    recorded = "late" in options
    if not recorded and quorum == "majority":
        quorum = "half"
    parts = [] if quorum == "majority" else [quorum]
    late = options.get("late", "accumulate")
    if late != "drop":
        parts.append(late)
    limiter = options.get("limiter", 0)
    if limiter != EAGER_LIMITER.get(quorum, 0):
        parts.append(f"limiter {limiter}")
    return parts


def time_to_accuracy(run: Run, target: float) -> float | None:
    """Training-clock seconds at the first evaluation whose accuracy reaches
    ``target`` (a fraction), None if none does."""
    accuracy = np.asarray(run.eval.get("accuracy", ()), dtype=np.float64)
    clock = np.asarray(run.eval.get("clock", ()), dtype=np.float64)
    reached = np.flatnonzero(accuracy >= target)  # NaN compares False
    return float(clock[reached[0]]) if reached.size else None


def baseline_key(row: dict) -> tuple:
    """What a run shares with the baseline run its speedup is measured
    against: P, imbalance, compute mode, model, dataset and per-rank batch."""
    return tuple(row[k] for k in ("ranks", "imbalance", "compute", "model", "dataset", "batch_size"))


def mean_throughput(rows: list[dict]) -> float | None:
    """The mean throughput of repeated runs: of the complete ones if there
    are any, else of the partial ones; None when none has a throughput."""
    rows = [r for r in rows if r["throughput"] is not None]
    rows = [r for r in rows if r["status"] == "complete"] or rows
    return float(np.mean([r["throughput"] for r in rows])) if rows else None


def _number(value):
    """A finite float, or None (NaN, missing)."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _row(run: Run, baseline: str, target: float, skip: int | None) -> dict:
    attrs = run.attrs
    summary = run.summary if skip is None else summarize(run, skip=skip)
    written = int(run.steps["clock"].shape[1]) if "clock" in run.steps else 0
    file_status = str(attrs.get("status", "unknown"))
    return {
        "file": run.path,
        "algorithm": str(attrs.get("algorithm", "?")),
        "label": run_label(run),
        "ranks": int(attrs.get("ranks", int(run.steps["clock"].shape[0]) if "clock" in run.steps else 0)),
        "group_size": int(attrs.get("group_size", 0)),
        "tau": int(attrs.get("tau", 0)),
        "imbalance": str(attrs.get("imbalance", "none")),
        "compute": str(attrs.get("compute", "?")),
        "model": str(attrs.get("model", "?")),
        "dataset": str(attrs.get("dataset", "?")),
        "batch_size": int(attrs.get("batch_size", 0)),
        "status": "complete" if file_status == "complete" and not is_partial(run.path) else "partial",
        "file_status": file_status,
        "steps": written,
        "steps_planned": int(attrs.get("steps_planned", 0)),
        "skip": skip or 0,
        "throughput": _number(summary.get("throughput")),
        "baseline": baseline,
        "speedup": None,
        "final_accuracy": _number(summary.get("final_accuracy")),
        "last_epoch_accuracy": _number(summary.get("last_epoch_accuracy")),
        "best_accuracy": _number(summary.get("best_accuracy")),
        "target_accuracy": target,
        "time_to_target": time_to_accuracy(run, target),
        "mean_wait_time": _number(summary.get("mean_wait_time")),
        "stale_fraction": _number(summary.get("stale_fraction")),
        "bytes_sent_per_rank": _number(summary.get("bytes_sent_per_rank")),
    }


def _sort_key(row: dict) -> tuple:
    return (
        row["imbalance"] != "none",
        row["imbalance"],
        row["compute"],
        row["ranks"],
        row["algorithm"],
        row["label"],
        row["group_size"],
        row["tau"],
        row["model"],
        row["dataset"],
        row["file"],
    )


def compare(
    runs: Iterable[Run | str | os.PathLike[str]],
    baseline: str = "allreduce_sgd",
    target_accuracy: float = 0.9,
    skip: int | None = None,
) -> list[dict[str, Any]]:
    """One row (a dict of :data:`ROW_FIELDS`) per run, sorted by imbalance
    (``none`` first), compute mode, P, algorithm and variant.

    A row's ``label`` (:func:`run_label`) tells variants of one algorithm
    apart (``sgp (1n)``, ``sgp (2n)``, ``wagma (fixed groups)``); its
    ``algorithm`` is the bare name.  The speedup of a run is its throughput
    over the :func:`mean_throughput` of the baseline's runs with the same
    :func:`baseline_key` (the complete ones if there are any): those
    labelled ``baseline`` (the plain algorithm, or a variant named by its
    label, ``"sgp (2n)"``), else those whose ``algorithm`` is ``baseline``
    (every variant of it); None where there is no such run.

    Args:
        runs: :class:`~wagma.results.reader.Run` objects or run file paths.
        baseline: the algorithm name (or a run label) speedups are measured against.
        target_accuracy: the accuracy (a fraction) whose first evaluation
            gives ``time_to_target``.
        skip: recompute the summary with :func:`~wagma.results.summary.summarize`,
            whose throughput leaves out the first ``skip`` steps (warm-up);
            None keeps the summary stored in the file.
    """
    if not 0 < target_accuracy <= 1:
        raise ValueError(f"target_accuracy must be a fraction in (0, 1], got {target_accuracy}")
    if skip is not None and skip < 0:
        raise ValueError(f"skip must be >= 0, got {skip}")
    loaded = [load_run(os.fspath(r)) if isinstance(r, (str, os.PathLike)) else r for r in runs]
    rows = sorted((_row(run, baseline, target_accuracy, skip) for run in loaded), key=_sort_key)
    labelled: dict[tuple, list[dict]] = {}
    named: dict[tuple, list[dict]] = {}
    for row in rows:
        if row["label"] == baseline:
            labelled.setdefault(baseline_key(row), []).append(row)
        if row["algorithm"] == baseline:
            named.setdefault(baseline_key(row), []).append(row)
    references = {key: mean_throughput(labelled.get(key, same)) for key, same in {**named, **labelled}.items()}
    for row in rows:
        reference = references.get(baseline_key(row))
        if row["throughput"] is not None and reference:
            row["speedup"] = row["throughput"] / reference
    return rows


def _status(row: dict) -> str:
    if row["status"] == "complete":
        return "complete"
    planned = f" of {row['steps_planned']}" if row["steps_planned"] else ""
    cause = f" ({row['file_status']})" if row["file_status"] not in ("running", "complete") else ""
    return f"partial{cause}: {row['steps']}{planned} steps"


def _fmt(value, spec: str, scale: float = 1.0) -> str:
    return "-" if value is None else format(value * scale, spec)


def _columns(rows: list[dict]) -> list:
    """(header, alignment, cell of a row) for every table column."""
    target = rows[0]["target_accuracy"] if rows else 0.9
    baseline = rows[0]["baseline"] if rows else None
    return [
        ("algorithm", "<", lambda r: r["label"]),
        ("P", ">", lambda r: str(r["ranks"])),
        ("S", ">", lambda r: str(r["group_size"]) if r["group_size"] else "-"),
        ("tau", ">", lambda r: str(r["tau"]) if r["tau"] else "-"),
        ("imbalance", "<", lambda r: r["imbalance"]),
        ("compute", "<", lambda r: r["compute"]),
        ("status", "<", _status),
        ("samples/s", ">", lambda r: _fmt(r["throughput"], ".1f")),
        (f"speedup vs {baseline}" if baseline else "speedup", ">", lambda r: _fmt(r["speedup"], ".2f")),
        ("final acc %", ">", lambda r: _fmt(r["final_accuracy"], ".2f", 100)),
        ("last-epoch acc %", ">", lambda r: _fmt(r["last_epoch_accuracy"], ".2f", 100)),
        ("best acc %", ">", lambda r: _fmt(r["best_accuracy"], ".2f", 100)),
        (f"time to {target * 100:g}% (s)", ">", lambda r: _fmt(r["time_to_target"], ".1f")),
        ("wait ms/step", ">", lambda r: _fmt(r["mean_wait_time"], ".2f", 1000)),
        ("stale", ">", lambda r: _fmt(r["stale_fraction"], ".3f")),
        ("MB sent/rank", ">", lambda r: _fmt(r["bytes_sent_per_rank"], ".2f", 1e-6)),
    ]


#: The headers of the printed table (time to target and speedup name their
#: target and baseline).
COLUMNS = tuple(header for header, _, _ in _columns([]))


def format_table(rows: list[dict], markdown: bool = False) -> str:
    """The rows of :func:`compare` as a text table aligned in columns, or as
    a GitHub markdown table; accuracies in percent, wait in milliseconds."""
    columns = _columns(rows)
    cells = [[header for header, _, _ in columns]]
    cells += [[cell(row) for _, _, cell in columns] for row in rows]
    return render(cells, [align for _, align, _ in columns], markdown)


def render(cells: list[list[str]], aligns: list[str], markdown: bool = False) -> str:
    """Rows of strings, the first one the headers, as columns aligned by
    ``aligns`` (``"<"`` or ``">"`` each) with a dashed rule under the
    headers, or as a GitHub markdown table."""
    if markdown:
        cells = [[c.replace("|", "\\|") for c in line] for line in cells]
        rule = ["---:" if align == ">" else "---" for align in aligns]
        return "\n".join("| " + " | ".join(line) + " |" for line in [cells[0], rule, *cells[1:]])
    widths = [max(len(line[i]) for line in cells) for i in range(len(aligns))]
    lines = ["  ".join(format(c, f"{a}{w}") for c, a, w in zip(line, aligns, widths)).rstrip() for line in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def write_csv(rows: list[dict], path: str) -> None:
    """The rows of :func:`compare` as CSV with the :data:`ROW_FIELDS` as
    header, in the run files' units (seconds, fractions); empty where None."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=ROW_FIELDS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if row[k] is None else row[k] for k in ROW_FIELDS})
