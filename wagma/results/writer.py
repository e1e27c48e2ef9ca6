"""Writing a run file: the root's appending writer and whole files at once.

:class:`FileWriter` appends rank rows, evaluations and ``sync/`` tables to
the partial file, opening and closing it at every flush so that the file is
readable whenever the run dies between flushes (one cut short in a flush is
written afresh from the logs beside it, :mod:`wagma.results.rewrite`), or
writes a new copy of it; :func:`write_run` writes a whole run at once (the
simulator's results, test fixtures).
"""

import json
import os
import shutil
from collections.abc import Mapping, Sequence
from typing import Any

import h5py
import numpy as np
from numpy.typing import ArrayLike

from .reader import load_run, steps_reached
from .schema import EVAL_FIELDS, LATER_STEP_FIELDS, MEMBERSHIP_FIELDS, NOTICED, SCHEMA, STEP_FIELDS, partial_path
from .summary import summarize

__all__ = ["FileWriter", "create_file", "write_run"]

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
    """The root's side: appends rows, evaluations and tables to the partial file.

    :meth:`create` makes (or reopens, to resume) the partial file of
    ``path``; :meth:`from_head` begins a new copy of it from a run file
    without rows (:func:`~wagma.results.journal.head_path`) under a
    temporary name, which :meth:`commit` puts in its place in one
    ``os.replace``.  Rows, evaluations and tables reach the file at
    :meth:`flush`.

    Args:
        path: the run's final file name (``.h5``).
        ranks: P, the rows of ``steps/``.
        file: the file that :meth:`flush` writes (default: the partial file).
    """

    def __init__(self, path: str, ranks: int, file: str | None = None) -> None:
        self.path, self.partial, self.ranks = path, partial_path(path), ranks
        self.file = file or self.partial
        #: Per rank, the step after its last row written.
        self.next_step = np.zeros(ranks, dtype=np.int64)
        #: The ranks whose rows ``steps.attrs["written"]`` waits for (all
        #: but those that left; none: it is the furthest step of any).
        self.members = list(range(ranks))
        self._rows: list[tuple[int, np.ndarray]] = []
        self._evals: list[tuple[list[float], ArrayLike | None]] = []
        self._tables: dict[str, tuple[np.ndarray, Sequence[str]]] = {}
        self._membership: np.ndarray | None = None
        self._clear_evals = False

    @classmethod
    def create(cls, path: str, attrs: Mapping[str, Any], ranks: int, resume_step: int | None) -> "FileWriter":
        """Create the partial file with root attributes ``attrs``, or, with
        ``resume_step`` and a partial file there, reopen it to continue from
        that step (rows at and after it, and evaluations after it, dropped);
        a new file resumed at ``resume_step`` has that many empty steps."""
        writer = cls(path, ranks)
        os.makedirs(os.path.dirname(os.path.abspath(writer.partial)), exist_ok=True)
        if resume_step is not None and os.path.exists(writer.partial):
            writer._reopen(resume_step)
        else:
            first_step = resume_step or 0
            stamp = {"resumed_at": np.array([first_step] if first_step else [], dtype=np.int64)}
            create_file(writer.partial, {**attrs, **stamp}, ranks, first_step)
            writer.next_step[:] = first_step
        return writer

    @classmethod
    def from_head(cls, path: str, head: str) -> "FileWriter":
        """A writer of a new copy of ``path``'s partial file, begun from
        ``head`` (a run file without rows) as ``NAME.partial.rewrite``."""
        file = partial_path(path)[: -len(".h5")] + ".rewrite"
        shutil.copyfile(head, file)
        with h5py.File(file, "r") as f:
            ranks = f["steps"][STEP_FIELDS[0]].shape[0]
        return cls(path, ranks, file)

    @classmethod
    def from_copy(cls, path: str) -> "FileWriter":
        """A writer of a new copy of ``path``'s partial file, begun as a copy
        of it; each rank's next step is the one after its last row there
        (at least ``written``)."""
        writer = cls.from_head(path, partial_path(path))
        with h5py.File(writer.file, "r") as f:
            writer.next_step[:] = np.maximum(steps_reached(f["steps"]["clock"][:]), int(f["steps"].attrs["written"]))
        return writer

    def clear_evals(self) -> None:
        """Drop the file's evaluations at the next flush, before the ones added since."""
        self._clear_evals = True

    def commit(self) -> None:
        """Put the copy begun by :meth:`from_head` in the partial file's place (``os.replace``)."""
        if self.file != self.partial:
            os.replace(self.file, self.partial)
            self.file = self.partial

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
            if "membership" in f:
                keep = int(np.sum(f["membership"]["step"][:] <= step))
                for name in MEMBERSHIP_FIELDS:
                    f["membership"][name].resize(keep, axis=0)
            f.attrs["resumed_at"] = np.append(f.attrs["resumed_at"], step).astype(np.int64)
            f.attrs["status"] = "running"
        self.next_step[:] = step

    def add_rows(self, rank: int, rows: np.ndarray) -> None:
        """Rank ``rank``'s rows ``[step, *STEP_FIELDS]``, steps ascending, for the next flush."""
        if len(rows):
            self._rows.append((rank, rows))

    def add_eval(self, values: Mapping[str, float], replica_accuracy: ArrayLike | None) -> None:
        self._evals.append(([values[k] for k in EVAL_FIELDS], replica_accuracy))

    def set_table(self, name: str, rows: ArrayLike, columns: Sequence[str]) -> None:
        """Table ``sync/<name>`` as it is now (its earlier rows unchanged), for the next flush."""
        self._tables[name] = (np.asarray(rows, dtype=np.float64), columns)

    def set_membership(self, rows: ArrayLike) -> None:
        """Group ``membership/`` as it is now: every change's rows (``MEMBERSHIP_FIELDS``), for the next flush."""
        self._membership = np.asarray(rows, dtype=np.float64).reshape(-1, len(MEMBERSHIP_FIELDS))

    @property
    def written(self) -> int:
        """``steps.attrs["written"]``: the steps every member has rows for (with no members, any)."""
        if not self.members:
            return int(self.next_step.max())
        return int(self.next_step[self.members].min())

    def flush(
        self,
        status: str | None = None,
        summary: Mapping[str, Any] | None = None,
        attrs: Mapping[str, Any] | None = None,
    ) -> None:
        pending = self._rows or self._evals or self._tables or self._membership is not None or self._clear_evals
        if not (pending or status or summary or attrs):
            return
        with h5py.File(self.file, "a") as f:
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
                    group[name].attrs["columns"] = json.dumps(list(columns))
                table, old = group[name], group[name].shape[0]
                table.resize(rows.shape[0], axis=0)
                table[old:] = rows[old:]
            if attrs:
                f.attrs.update({k: _attr(v) for k, v in attrs.items()})
            steps = f["steps"]
            if self._rows:
                self._write_rows(steps)
            steps.attrs["written"] = self.written
            if self._clear_evals:
                for name in (*EVAL_FIELDS, "replica_accuracy"):
                    f["eval"][name].resize(0, axis=0)
                self._clear_evals = False
            if self._evals:
                ev, n = f["eval"], f["eval"]["step"].shape[0]
                for name in (*EVAL_FIELDS, "replica_accuracy"):
                    ev[name].resize(n + len(self._evals), axis=0)
                for i, (values, replicas) in enumerate(self._evals):
                    for name, value in zip(EVAL_FIELDS, values):
                        ev[name][n + i] = value
                    if replicas is not None:
                        ev["replica_accuracy"][n + i] = replicas
            if self._membership is not None:
                _write_membership(f, self._membership)
            if summary:
                f.require_group("summary").attrs.update({k: _attr(v) for k, v in summary.items()})
            if status:
                f.attrs["status"] = status
        self._rows, self._evals, self._tables, self._membership = [], [], {}, None

    def _write_rows(self, steps):
        end = max(int(rows[-1, 0]) + 1 for _, rows in self._rows)
        if end > steps[STEP_FIELDS[0]].shape[1]:
            for name in STEP_FIELDS:
                steps[name].resize(end, axis=1)
        by_rank: dict[int, list[np.ndarray]] = {}
        for rank, rows in self._rows:
            by_rank.setdefault(rank, []).append(rows)
        for rank, blocks in by_rank.items():
            rows = np.concatenate(blocks)
            # One slab per rank, field and run of consecutive steps (one run
            # but where a resumed segment began after the rank's last row).
            breaks = np.flatnonzero(np.diff(rows[:, 0]) != 1) + 1
            for run in np.split(rows, breaks):
                lo, hi = int(run[0, 0]), int(run[-1, 0]) + 1
                for i, name in enumerate(STEP_FIELDS, start=1):
                    steps[name][rank, lo:hi] = run[:, i]
            self.next_step[rank] = max(self.next_step[rank], int(rows[-1, 0]) + 1)


def create_file(file: str, attrs: Mapping[str, Any], ranks: int, first_step: int = 0) -> None:
    """A run file without rows at ``file``: root attributes ``attrs`` (with
    ``schema`` and status ``running``), ``steps/`` of ``ranks`` rows and
    ``first_step`` empty steps, empty ``eval/``."""
    # Free space tracked in the file (HDF5 >= 1.10): each flush opens the file again and rewrites the
    # compressed chunk it extends elsewhere, and without it the space so freed is lost at every close
    # (a 20117-step, 8-rank run's file: 9.7 MB, of which 4.8 MB data).
    with h5py.File(file, "w", fs_strategy="fsm", fs_persist=True) as f:
        f.attrs.update({k: _attr(v) for k, v in attrs.items()})
        f.attrs.update(schema=SCHEMA, status="running")
        steps = f.create_group("steps")
        for name in STEP_FIELDS:
            steps.create_dataset(
                name,
                shape=(ranks, first_step),
                maxshape=(ranks, None),
                dtype="f8",
                chunks=(ranks, _CHUNK),
                fillvalue=np.nan,
                compression="gzip",  # a third of the size for a long run's clocks and losses (shuffled bytes)
                shuffle=True,
            )
        steps.attrs["written"] = first_step
        ev = f.create_group("eval")
        for name in EVAL_FIELDS:
            ev.create_dataset(name, shape=(0,), maxshape=(None,), dtype="f8", chunks=(_CHUNK,))
        ev.create_dataset(
            "replica_accuracy",
            shape=(0, ranks),
            maxshape=(None, ranks),
            dtype="f8",
            chunks=(_CHUNK, ranks),
            fillvalue=np.nan,
        )


def _write_membership(f: h5py.File, rows: np.ndarray) -> None:
    """Group ``membership/`` holding ``rows``, one dataset per field (rewritten whole: a few rows)."""
    group = f.require_group("membership")
    for i, name in enumerate(MEMBERSHIP_FIELDS):
        if name in group:
            del group[name]
        group.create_dataset(name, data=rows[:, i], maxshape=(None,), chunks=(_CHUNK,))
    group.attrs["noticed"] = json.dumps(NOTICED)


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
    writer = FileWriter.create(path, attrs, ranks, None)
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
