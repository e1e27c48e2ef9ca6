"""Every rank's append-only logs beside a run file: the rows that outlive the rank writing the file.

The folder ``NAME.partial.rows/`` (:func:`~wagma.results.schema.rows_path`)
beside ``NAME.partial.h5`` holds, for each rank ``R`` of the communicator
the run began on (its row of ``steps/``, whatever membership changes
follow):

``rank-RRRRR.f64``
    its step rows, raw little-endian float64 rows ``[step, *STEP_FIELDS]``
    (:data:`STEP_WIDTH` values), one ``os.write`` per row, in the order
    recorded (steps ascending);
``rank-RRRRR.eval.f64``
    the evaluations it recorded, ``[*EVAL_FIELDS, replica_accuracy of
    every rank]``;
``rank-RRRRR.membership.f64``
    the membership changes it recorded, ``MEMBERSHIP_FIELDS``, one row per
    rank that left;

and ``head.hdf5``: the run file as it was created (or reopened to resume),
without rows: its attributes and the layout of its datasets (not named
``*.h5``, so that folders searched for run files leave it out).

A process killed by a signal loses at most the row it was writing: what
``os.write`` returned from is the kernel's and reaches the file.  A row cut
short is recognised by the log's length and left out.  A node that fails
loses what its kernel had not yet written back.

Assumption: the run file's folder is visible to every rank (a shared file
system on a cluster, where results folders are), since the rank that writes
the file reads the others' logs (checked when the recorder starts).  A
POSIX file system (Lustre, GPFS, a local disk) shows a row to the reader
as soon as it is written; NFS may show it only once its writer closes the
log, at the end of the run, which the final file waits for.
"""

from __future__ import annotations

import os
import shutil
import struct
from collections.abc import Callable, Sequence

import h5py
import numpy as np

from .schema import EVAL_FIELDS, MEMBERSHIP_FIELDS, STEP_FIELDS, rows_path

__all__ = ["STEP_WIDTH", "Journal", "RowLog", "head_path", "read_rows", "truncate_rows"]

#: The number of values in a step row (the step, then the :data:`~wagma.results.schema.STEP_FIELDS`).
STEP_WIDTH = 1 + len(STEP_FIELDS)
_DTYPE = np.dtype("<f8")


class RowLog:
    """One log of fixed-width float64 rows, opened to append (``O_APPEND``; created if absent)."""

    def __init__(self, path: str, width: int) -> None:
        self.path, self.width = path, width
        self._pack = struct.Struct(f"<{width}d").pack
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def append(self, row: Sequence[float]) -> None:
        """Write one row (``width`` numbers) with one ``os.write``."""
        data = self._pack(*row)
        written = os.write(self._fd, data)
        while written < len(data):  # a regular file takes the whole row unless the disk is full
            written += os.write(self._fd, data[written:])

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def read_rows(path: str, width: int, offset: int = 0) -> tuple[np.ndarray, int]:
    """The whole rows of the log at ``path`` from byte ``offset`` on, as an
    ``(n, width)`` array, and the offset after them (a row being written, or
    cut short by a kill, is left for later); none where the log does not exist."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return np.zeros((0, width)), offset
    count = len(data) // (width * _DTYPE.itemsize)
    rows = np.frombuffer(data, dtype=_DTYPE, count=count * width).reshape(count, width)
    return rows.astype(np.float64), offset + count * width * _DTYPE.itemsize


def truncate_rows(path: str, width: int, keep: Callable[[np.ndarray], np.ndarray]) -> None:
    """Cut the log at ``path`` after its first rows for which ``keep(rows)``
    (a boolean per row) holds, up to the first that it does not (a row cut
    short goes too)."""
    if not os.path.exists(path):
        return
    rows, _ = read_rows(path, width)
    kept = keep(rows)
    count = int(np.argmin(kept)) if not kept.all() else len(rows)
    os.truncate(path, count * width * _DTYPE.itemsize)


def head_path(path: str) -> str:
    """The head of the logs beside the run file ``path``: ``NAME.partial.rows/head.hdf5``."""
    return os.path.join(rows_path(path), "head.hdf5")


class Journal:
    """The logs beside the run file ``path`` (its final or partial name) of a run of ``ranks`` ranks."""

    def __init__(self, path: str, ranks: int) -> None:
        self.path, self.folder, self.ranks = path, rows_path(path), ranks
        self.head = head_path(path)
        self.eval_width = len(EVAL_FIELDS) + ranks

    @classmethod
    def beside(cls, path: str) -> Journal | None:
        """The logs beside the run file ``path``, their rank count read from
        their head; None where there are none."""
        head = head_path(path)
        if not os.path.exists(head):
            return None
        with h5py.File(head, "r") as f:
            return cls(path, int(f["steps"][STEP_FIELDS[0]].shape[0]))

    def exists(self) -> bool:
        """Whether the logs' head is there (a run that began with them)."""
        return os.path.exists(self.head)

    def rows_file(self, rank: int) -> str:
        return os.path.join(self.folder, f"rank-{rank:05d}.f64")

    def eval_file(self, rank: int) -> str:
        return os.path.join(self.folder, f"rank-{rank:05d}.eval.f64")

    def membership_file(self, rank: int) -> str:
        return os.path.join(self.folder, f"rank-{rank:05d}.membership.f64")

    def logs(self, rank: int) -> tuple[RowLog, RowLog, RowLog]:
        """Rank ``rank``'s three logs, opened to append: steps, evaluations, membership."""
        return (
            RowLog(self.rows_file(rank), STEP_WIDTH),
            RowLog(self.eval_file(rank), self.eval_width),
            RowLog(self.membership_file(rank), len(MEMBERSHIP_FIELDS)),
        )

    def continued_logs(self, rank: int) -> tuple[RowLog, RowLog, RowLog]:
        """Rank ``rank``'s logs for a process that takes its row over (a
        replacement, :mod:`wagma.healing`): each cut to its whole rows first
        (the row the dead rank was writing when it was killed goes), then
        opened to append, after the rows the dead rank wrote."""
        widths = (STEP_WIDTH, self.eval_width, len(MEMBERSHIP_FIELDS))
        for path, width in zip((self.rows_file(rank), self.eval_file(rank), self.membership_file(rank)), widths):
            truncate_rows(path, width, lambda rows: np.ones(len(rows), dtype=bool))
        return self.logs(rank)

    def rows(self, rank: int, offset: int = 0) -> tuple[np.ndarray, int]:
        """Rank ``rank``'s step rows from byte ``offset`` on (:func:`read_rows`)."""
        return read_rows(self.rows_file(rank), STEP_WIDTH, offset)

    def evaluations(self) -> np.ndarray:
        """Every rank's evaluations, one row per evaluated step (the lowest
        rank's where several recorded it, as every rank does when all
        evaluate together), by step."""
        rows = np.concatenate([read_rows(self.eval_file(r), self.eval_width)[0] for r in range(self.ranks)])
        _, first = np.unique(rows[:, 0], return_index=True)  # sorted by step, each step's first row
        return rows[first]

    def membership(self) -> np.ndarray:
        """Every membership change any rank recorded, each row once (every
        survivor records the same), by step, clock and rank that left."""
        width = len(MEMBERSHIP_FIELDS)
        rows = np.concatenate([read_rows(self.membership_file(r), width)[0] for r in range(self.ranks)])
        return np.unique(rows, axis=0) if len(rows) else np.zeros((0, width))

    def cut(self, step: int) -> None:
        """Keep what a run resumed at ``step`` keeps: step rows before it,
        evaluations and membership changes at or before it."""
        for rank in range(self.ranks):
            truncate_rows(self.rows_file(rank), STEP_WIDTH, lambda rows: rows[:, 0] < step)
            truncate_rows(self.eval_file(rank), self.eval_width, lambda rows: rows[:, 0] <= step)
            truncate_rows(self.membership_file(rank), len(MEMBERSHIP_FIELDS), lambda rows: rows[:, 0] <= step)

    def missing(self) -> list[int]:
        """The ranks whose step log is not there (not yet opened, or on a
        file system this process does not see)."""
        return [r for r in range(self.ranks) if not os.path.exists(self.rows_file(r))]

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
