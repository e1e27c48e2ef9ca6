"""Reading a run file, complete or partial, into memory."""

import json
import os
from dataclasses import dataclass, field
from typing import Any

import h5py
import numpy as np

from .journal import Journal
from .schema import LATER_STEP_FIELDS, MEMBERSHIP_FIELDS, SCHEMA, STEP_FIELDS, is_partial, rows_path
from .summary import summarize

__all__ = ["Run", "load_run", "steps_reached"]


@dataclass
class Run:
    """A run file's content: attributes, the written steps, evaluations, tables, membership changes, summary."""

    path: str
    attrs: dict[str, Any]
    steps: dict[str, np.ndarray] = field(default_factory=dict)  # field -> (P, written) array
    eval: dict[str, np.ndarray] = field(default_factory=dict)  # field -> (E,) array
    summary: dict[str, Any] = field(default_factory=dict)
    tables: dict[str, np.ndarray] = field(default_factory=dict)  # sync/<name> by name -> array (rounds, stragglers)
    # membership/<field> -> (rows,) array, one row per rank that left
    membership: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def config(self) -> dict[str, Any]:
        return json.loads(self.attrs.get("config", "{}"))


def _plain(value):
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, np.generic):
        return value.item()
    return value


def load_run(path: str, *, logs: bool = True) -> Run:
    """Read a run file (complete or partial) into memory; the summary is
    :func:`~wagma.results.summary.summarize`'s, with the stored one's values where present.

    A partial file that still says ``running`` is read with the rows of the
    logs beside it (:mod:`wagma.results.journal`) that it lacks: a live
    run's since its root's last flush, or a dead job's that nobody closed;
    ``written`` is then the steps every rank that has not left reached
    (``logs=False``: the file alone)."""
    with h5py.File(path, "r") as f:
        if f.attrs.get("schema") != SCHEMA:
            raise ValueError(f"{path}: not a run file of schema {SCHEMA!r} (got {f.attrs.get('schema')!r})")
        attrs = {k: _plain(v) for k, v in f.attrs.items()}
        written = int(f["steps"].attrs["written"])
        merge = logs and is_partial(path) and attrs.get("status") == "running" and os.path.isdir(rows_path(path))
        steps = {k: f["steps"][k][:] if merge else f["steps"][k][:, :written] for k in STEP_FIELDS if k in f["steps"]}
        for name, default in LATER_STEP_FIELDS.items():
            if name not in steps:
                steps[name] = np.full_like(steps["clock"], default(attrs))
        evals = {k: f["eval"][k][:] for k in f["eval"]}
        tables = {k: f["sync"][k][:] for k in f["sync"]} if "sync" in f else {}
        membership = {k: f["membership"][k][:] for k in MEMBERSHIP_FIELDS} if "membership" in f else {}
        stored = {k: _plain(v) for k, v in f["summary"].attrs.items()} if "summary" in f else {}
    if merge:
        steps = _with_logs(path, steps, written, attrs, membership)
    run = Run(path, attrs, steps, evals, tables=tables, membership=membership)
    run.summary = {**summarize(run), **stored}
    return run


def _with_logs(path, steps, written, attrs, membership):
    """``steps`` (whole datasets) with every row of the logs beside
    ``path`` written over them, cut at the steps that every rank that has
    not left (``membership/left``, ``dead_ranks``) has reached."""
    ranks = steps["clock"].shape[0]
    journal = Journal(path, ranks)
    logged = [journal.rows(rank)[0] for rank in range(ranks)]
    end = max([steps["clock"].shape[1], *(int(rows[-1, 0]) + 1 for rows in logged if len(rows))])
    steps = {k: np.pad(v, ((0, 0), (0, end - v.shape[1])), constant_values=np.nan) for k, v in steps.items()}
    for rank, rows in enumerate(logged):
        for i, name in enumerate(STEP_FIELDS, start=1):
            steps[name][rank, rows[:, 0].astype(int)] = rows[:, i]
    extent = steps_reached(steps["clock"])
    gone = set(membership.get("left", np.zeros(0)).astype(int)) | set(json.loads(attrs.get("dead_ranks", "[]")))
    members = [r for r in range(ranks) if r not in gone]
    reached = int(extent[members].min()) if members else int(extent.max())
    return {k: v[:, : max(written, reached)] for k, v in steps.items()}


def steps_reached(clock: np.ndarray) -> np.ndarray:
    """Per rank (a row of ``clock``, ``steps/clock``), the step after its
    last row: the last whose clock is set (every recorded row has one); 0
    for a rank without any."""
    present = ~np.isnan(clock)
    last = clock.shape[1] - np.argmax(present[:, ::-1], axis=1) if clock.shape[1] else np.zeros(len(clock))
    return np.where(present.any(axis=1), last, 0).astype(np.int64)
