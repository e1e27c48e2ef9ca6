"""Recording a run as it goes: every rank's rows, into one file written by rank 0.

Rank 0 writes; the other ranks send their rows as they go (a
:class:`~collectives.collect.RootCollector`, which never makes a rank wait
for another).  While the run lasts the file is ``NAME.partial.h5``, opened,
appended to and closed again at most every ``flush_seconds``, so a run that
dies keeps what it measured up to the last flush in a readable file; at the
end it is renamed to ``NAME.h5`` in one ``os.replace``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike

from collectives.collect import RootCollector

from .reader import load_run
from .schema import STEP_FIELDS
from .summary import summarize
from .writer import FileWriter

if TYPE_CHECKING:
    from mpi4py import MPI

__all__ = ["RunRecorder"]


class RunRecorder:
    """Every rank's per-step measurements, into one run file written by rank 0.

    Collective to construct and to :meth:`close`; :meth:`record` never
    communicates synchronously (rows leave in blocks of ``post_every``).

    Args:
        comm: an ``mpi4py.MPI.Intracomm`` over the run's ranks.
        path: the final file name (``.h5``); the partial one is
            :func:`~wagma.results.schema.partial_path` of it.
        attrs: root attributes (the configuration and provenance).
        resume_step: continue the partial file of an interrupted run from
            this step (rows at and after it are dropped), or start a new
            file whose first ``resume_step`` columns are empty; None for a
            fresh run.
        flush_seconds: how often rank 0 rewrites the partial file at most.
        post_every: steps a rank buffers before sending them (1: a rank that
            is killed loses no step it finished).
    """

    def __init__(
        self,
        comm: MPI.Intracomm,
        path: str,
        attrs: Mapping[str, Any],
        *,
        resume_step: int | None = None,
        flush_seconds: float = 2.0,
        post_every: int = 8,
    ) -> None:
        self.ranks = comm.Get_size()
        self.collector = RootCollector(comm, 1 + len(STEP_FIELDS))
        self.writer = FileWriter(path, attrs, self.ranks, resume_step) if self.collector.is_root else None
        self.flush_seconds, self.post_every = flush_seconds, post_every
        self._buffer: list[list[float]] = []
        self._last_flush = time.monotonic()
        self._table_rows: dict[str, int] = {}  # rows of each sync table handed to the writer

    @property
    def path(self) -> str | None:
        return self.writer.path if self.writer else None

    def record(self, step: int, **values: float) -> None:
        """This rank's measurements of ``step`` (the :data:`~wagma.results.schema.STEP_FIELDS`)."""
        self._buffer.append([step, *(values[k] for k in STEP_FIELDS)])
        if len(self._buffer) >= self.post_every:
            self.collector.post(np.array(self._buffer))
            self._buffer = []
        if self.writer:
            self._drain()
            if time.monotonic() - self._last_flush >= self.flush_seconds:
                self.flush()

    def record_tables(self, tables: Mapping[str, tuple[np.ndarray, list[str]]]) -> None:
        """On rank 0: the algorithm's ``sync/<name>`` tables as they stand
        (``name -> (rows, columns)``, :meth:`~wagma.algorithms.base.Algorithm.sync_tables`),
        whose rows only ever grow.  A table goes to the next flush the first
        time it is handed (empty or not) and again whenever it has grown, so
        a loop may hand them after every step, and a run that fails keeps
        them up to its last flush.  Elsewhere: nothing."""
        if not self.writer:
            return
        for name, (rows, columns) in tables.items():
            if len(rows) > self._table_rows.get(name, -1):
                self.writer.set_table(name, rows, columns)
                self._table_rows[name] = len(rows)

    def record_eval(self, replica_accuracy: ArrayLike | None = None, **values: float) -> None:
        """On rank 0: one evaluation (the :data:`~wagma.results.schema.EVAL_FIELDS`)."""
        if self.writer:
            self.writer.add_eval(values, replica_accuracy)

    def _drain(self):
        for rank, rows in self.collector.poll():
            self.writer.add_rows(rank, rows)

    def flush(self) -> None:
        """Rank 0: write what has arrived (local; the others: nothing)."""
        if self.writer:
            self._drain()
            self.writer.flush()
            self._last_flush = time.monotonic()

    def close(self, status: str, dead: Collection[int] = (), attrs: Mapping[str, Any] | None = None) -> str | None:
        """Collective over the living ranks: gather every rank's remaining
        rows, write the :func:`~wagma.results.summary.summarize` figures and ``status``;
        ``"complete"`` renames the file to its final name.  ``dead``: ranks
        that died (ULFM), not waited for; their rows end where they died,
        and the root attribute ``dead_ranks`` lists them.  ``attrs``: more
        root attributes (rank 0's).  Returns the path written (rank 0) or None."""
        if self._buffer:
            self.collector.post(np.array(self._buffer))
            self._buffer = []
        for rank, rows in self.collector.finish(absent=dead):
            assert self.writer is not None  # only the root receives rows
            self.writer.add_rows(rank, rows)
        self.collector.close()
        if not self.writer:
            return None
        self.writer.flush(attrs={**(attrs or {}), "dead_ranks": json.dumps(sorted(dead))})
        if dead:  # the others' steps count as written past the dead ranks' last one
            alive = [r for r in range(self.ranks) if r not in set(dead)]
            self.writer.next_step[list(dead)] = self.writer.next_step[alive].min() if alive else 0
            self.writer.flush(summary={"dead_ranks": len(dead)})
        self.writer.flush(status=status, summary=summarize(load_run(self.writer.partial)))
        if status != "complete":
            return self.writer.partial
        os.replace(self.writer.partial, self.writer.path)
        return self.writer.path

    def abandon(self, status: str = "failed") -> None:
        """After an error, without communicating: rank 0 writes what has
        arrived and marks the partial file with ``status``."""
        if self.writer:
            self._drain()
            self.writer.flush(status=status)
