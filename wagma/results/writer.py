"""Writing a run file: the root's appending writer and whole files at once.

:class:`FileWriter` appends rank rows, evaluations and ``sync/`` tables to
the partial file, opening and closing it at every flush so that the file is
readable whenever the run dies; :func:`write_run` writes a whole run at once
(the simulator's results, test fixtures).
"""

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import h5py
import numpy as np
from numpy.typing import ArrayLike

from .reader import load_run
from .schema import EVAL_FIELDS, LATER_STEP_FIELDS, SCHEMA, STEP_FIELDS, partial_path
from .summary import summarize

__all__ = ["FileWriter", "write_run"]

#: Rows per HDF5 chunk of the growing datasets.
_CHUNK = 256


def _attr(value):
    """An HDF5-storable attribute value (dicts and None as JSON; str
    subclasses such as ``torch.__version__`` as plain str)."""
    if isinstance(value, str):
        return str(value)
    if isinstance(value, (dict, list, tuple)) and not (
        isinstance(value, (list, tuple)) and value and all(isinstance(v, (int, float)) for v in value)
    ):
        return json.dumps(value)
    return "null" if value is None else value


class FileWriter:
    """The root's side: appends rows and evaluations to the partial file."""

    def __init__(self, path: str, attrs: Mapping[str, Any], ranks: int, resume_step: int | None) -> None:
        self.path, self.partial, self.ranks = path, partial_path(path), ranks
        self.next_step = np.zeros(ranks, dtype=np.int64)
        self._rows: list[tuple[int, np.ndarray]] = []
        self._evals: list[tuple[list[float], ArrayLike | None]] = []
        self._tables: dict[str, tuple[np.ndarray, Sequence[str]]] = {}
        os.makedirs(os.path.dirname(os.path.abspath(self.partial)), exist_ok=True)
        if resume_step is not None and os.path.exists(self.partial):
            self._reopen(resume_step)
        else:
            self._create(attrs, resume_step or 0)

    def _create(self, attrs, first_step):
        with h5py.File(self.partial, "w") as f:
            f.attrs.update({k: _attr(v) for k, v in attrs.items()})
            f.attrs.update(
                schema=SCHEMA, status="running", resumed_at=np.array([first_step] if first_step else [], dtype=np.int64)
            )
            steps = f.create_group("steps")
            for name in STEP_FIELDS:
                steps.create_dataset(
                    name,
                    shape=(self.ranks, first_step),
                    maxshape=(self.ranks, None),
                    dtype="f8",
                    chunks=(self.ranks, _CHUNK),
                    fillvalue=np.nan,
                )
            steps.attrs["written"] = first_step
            ev = f.create_group("eval")
            for name in EVAL_FIELDS:
                ev.create_dataset(name, shape=(0,), maxshape=(None,), dtype="f8", chunks=(_CHUNK,))
            ev.create_dataset(
                "replica_accuracy",
                shape=(0, self.ranks),
                maxshape=(None, self.ranks),
                dtype="f8",
                chunks=(_CHUNK, self.ranks),
                fillvalue=np.nan,
            )
        self.next_step[:] = first_step

    def _reopen(self, step):
        """Continue an interrupted run's file from its checkpoint at ``step``."""
        with h5py.File(self.partial, "a") as f:
            for name in STEP_FIELDS:
                ds = f["steps"][name]
                ds.resize(min(ds.shape[1], step), axis=1)
            f["steps"].attrs["written"] = min(int(f["steps"].attrs["written"]), step)
            keep = int(np.sum(f["eval"]["step"][:] <= step))
            for name in (*EVAL_FIELDS, "replica_accuracy"):
                f["eval"][name].resize(keep, axis=0)
            f.attrs["resumed_at"] = np.append(f.attrs["resumed_at"], step).astype(np.int64)
            f.attrs["status"] = "running"
        self.next_step[:] = step

    def add_rows(self, rank: int, rows: np.ndarray) -> None:
        if len(rows):
            self._rows.append((rank, rows))

    def add_eval(self, values: Mapping[str, float], replica_accuracy: ArrayLike | None) -> None:
        self._evals.append(([values[k] for k in EVAL_FIELDS], replica_accuracy))

    def set_table(self, name: str, rows: ArrayLike, columns: Sequence[str]) -> None:
        """Table ``sync/<name>`` as it is now (its earlier rows unchanged), for the next flush."""
        self._tables[name] = (np.asarray(rows, dtype=np.float64), columns)

    def flush(
        self,
        status: str | None = None,
        summary: Mapping[str, Any] | None = None,
        attrs: Mapping[str, Any] | None = None,
    ) -> None:
        if not (self._rows or self._evals or self._tables or status or summary or attrs):
            return
        with h5py.File(self.partial, "a") as f:
            for name, (rows, columns) in self._tables.items():
                # Tables only grow: the new rows are appended to a chunked
                # dataset (rewriting it at every flush would leave the old
                # copies' space unreclaimed in the file).
                group = f.require_group("sync")
                if name not in group:
                    group.create_dataset(
                        name,
                        shape=(0, rows.shape[1]),
                        maxshape=(None, rows.shape[1]),
                        dtype="f8",
                        chunks=(_CHUNK, rows.shape[1]),
                    )
                    group[name].attrs["columns"] = json.dumps(columns)
                table, old = group[name], group[name].shape[0]
                table.resize(rows.shape[0], axis=0)
                table[old:] = rows[old:]
            if attrs:
                f.attrs.update({k: _attr(v) for k, v in attrs.items()})
            steps = f["steps"]
            if self._rows:
                end = max(int(rows[:, 0].max()) + 1 for _, rows in self._rows)
                if end > steps[STEP_FIELDS[0]].shape[1]:
                    for name in STEP_FIELDS:
                        steps[name].resize(end, axis=1)
                by_rank: dict[int, list[np.ndarray]] = {}
                for rank, rows in self._rows:
                    by_rank.setdefault(rank, []).append(rows)
                for rank, blocks in by_rank.items():
                    # One rank's rows arrive in order and consecutively: one slab per rank and field.
                    rows = np.concatenate(blocks)
                    lo, hi = int(rows[0, 0]), int(rows[-1, 0]) + 1
                    for i, name in enumerate(STEP_FIELDS, start=1):
                        steps[name][rank, lo:hi] = rows[:, i]
                    self.next_step[rank] = max(self.next_step[rank], hi)
            steps.attrs["written"] = int(self.next_step.min())
            if self._evals:
                ev, n = f["eval"], f["eval"]["step"].shape[0]
                for name in (*EVAL_FIELDS, "replica_accuracy"):
                    ev[name].resize(n + len(self._evals), axis=0)
                for i, (values, replicas) in enumerate(self._evals):
                    for name, value in zip(EVAL_FIELDS, values):
                        ev[name][n + i] = value
                    if replicas is not None:
                        ev["replica_accuracy"][n + i] = replicas
            if summary:
                f.require_group("summary").attrs.update({k: _attr(v) for k, v in summary.items()})
            if status:
                f.attrs["status"] = status
        self._rows, self._evals, self._tables = [], [], {}


def write_run(
    path: str,
    attrs: Mapping[str, Any],
    steps: Mapping[str, ArrayLike],
    evals: Mapping[str, Any] | None = None,
    status: str = "complete",
) -> None:
    """Write a whole run file at once (the simulator's results, test fixtures).

    ``steps``: every :data:`~wagma.results.schema.STEP_FIELDS` name -> a ``(P, T)`` array;
    ``evals``: :data:`~wagma.results.schema.EVAL_FIELDS` names (and optionally
    ``replica_accuracy``, ``(E, P)``) -> arrays of one length.  The summary
    is :func:`~wagma.results.summary.summarize`'s.
    """
    steps = {
        **{k: np.full(np.shape(steps["clock"]), default(attrs)) for k, default in LATER_STEP_FIELDS.items()},
        **steps,
    }
    missing = [k for k in STEP_FIELDS if k not in steps]
    if missing:
        raise ValueError(f"steps is missing {', '.join(missing)}")
    ranks, count = np.shape(steps["clock"])
    writer = FileWriter(path, attrs, ranks, None)
    with h5py.File(writer.partial, "a") as f:  # whole arrays at once, not rank by rank
        for name in STEP_FIELDS:
            f["steps"][name].resize(count, axis=1)
            f["steps"][name][...] = np.asarray(steps[name], dtype=np.float64)
        f["steps"].attrs["written"] = count
    writer.next_step[:] = count
    evals = evals or {}
    for i in range(len(evals.get("step", ()))):
        replicas = evals["replica_accuracy"][i] if "replica_accuracy" in evals else None
        writer.add_eval({k: evals[k][i] for k in EVAL_FIELDS}, replicas)
    writer.flush()
    run = load_run(writer.partial)
    writer.flush(status=status, summary=summarize(run))
    os.replace(writer.partial, path)
