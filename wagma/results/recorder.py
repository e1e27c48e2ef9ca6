"""Recording a run as it goes: every rank's rows in a log of its own, gathered into one file by a root that can change.

Every rank appends each row it records to its own log beside the run file
(:mod:`wagma.results.journal`: one ``os.write`` a row, so a rank that is
killed loses at most the row it was writing, and no rank ever waits for
another to record).  The root, rank 0 of the recorder's communicator,
reads every rank's log on from where it last stopped and brings
``NAME.partial.h5`` up to date at most every ``flush_seconds`` (opened,
appended to and closed again, so that a run that dies leaves a readable
file); at the end the file is renamed to ``NAME.h5`` in one ``os.replace``
and the logs are removed.

The root can change: after ranks die, the survivors' communicator (ULFM:
revoke, shrink) is handed to :meth:`RunRecorder.rebuild`, whose new rank 0
writes the whole file afresh from the logs, the dead ranks' rows up to
their death included.  Where the job dies instead (no ULFM: the launcher
ends every rank), the logs stay beside the partial file:
:func:`~wagma.results.reader.load_run` reads them too, and ``python -m
wagma.results complete PATH`` writes them into the file and marks it
(:func:`~wagma.results.rewrite.complete_run`).

Assumption: the run file's folder is one file system that every rank sees
(a shared one on a cluster, as results folders are): the root reads the
others' logs.  The recorder checks it when it starts and refuses on every
rank where the root does not see a log.
"""

from __future__ import annotations

import json
import operator
import os
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import h5py
import numpy as np
from numpy.typing import ArrayLike

from collectives.failures import track

from .journal import Journal
from .reader import load_run
from .rewrite import read_tables, rewrite_from_logs, update_from_logs
from .schema import EVAL_FIELDS, MEMBERSHIP_FIELDS, NOTICED, STEP_FIELDS, partial_path
from .summary import summarize
from .writer import FileWriter, create_file

if TYPE_CHECKING:
    from mpi4py import MPI

__all__ = ["RunRecorder"]

_CLOSED = 1  # tag of a rank's "my logs are closed" message to the root
_STEP_VALUES = operator.itemgetter(*STEP_FIELDS)  # a row's values, in the log's order


@dataclass
class _Table:
    """A ``sync/`` table as the root stores it: under ``stored`` (the
    name, or ``NAME.K`` from membership change K on where a rebuilt
    algorithm's table has other columns), ``earlier`` rows of previous
    memberships, then ``rows``, this membership's as last handed."""

    stored: str
    columns: list[str]
    earlier: np.ndarray
    rows: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    handed: bool = False


def _change_of(stored: str) -> int:
    """K of a table stored as ``NAME.K`` (0 for ``NAME``)."""
    _, _, change = stored.partition(".")
    return int(change) if change.isdigit() else 0


def _noticed_code(noticed: str) -> int:
    """The code of ``noticed`` in ``membership/noticed``; ValueError naming the accepted names."""
    if noticed not in NOTICED:
        raise ValueError(f"noticed must be one of {', '.join(NOTICED)}, got {noticed!r}")
    return NOTICED[noticed]


class RunRecorder:
    """Every rank's per-step measurements, evaluations and membership changes, into one run file.

    Collective to construct, to :meth:`rebuild` and to :meth:`close`;
    :meth:`record` never communicates.  Rows are indexed by the rank in
    ``comm``, the communicator the recorder was built on, through every
    membership change.

    Args:
        comm: an ``mpi4py.MPI.Intracomm`` over the run's ranks (duplicated).
        path: the final file name (``.h5``); the partial one is
            :func:`~wagma.results.schema.partial_path` of it, the logs are in
            :func:`~wagma.results.schema.rows_path` of it.
        attrs: root attributes (the configuration and provenance).
        resume_step: continue the partial file of an interrupted run from
            this step (first the rows its logs hold that it lacks are
            written into it; then rows at and after the step are dropped,
            from it and from the logs), or start a new file whose first
            ``resume_step`` columns are empty; None for a fresh run.
        members: the row of each rank of ``comm`` where the run resumes on
            fewer ranks than it began with (the ranks left after ranks
            died, ``experiments.checkpoint``): ``members[rank]``, in a
            file of ``attrs["ranks"]`` rows; None: rank r is row r.
        flush_seconds: how often the root rewrites the partial file at most.

    Raises:
        RuntimeError: on every rank, where rank 0 could not make the file
            or does not see every rank's log (the folder is not shared).
    """

    def __init__(
        self,
        comm: MPI.Intracomm,
        path: str,
        attrs: Mapping[str, Any],
        *,
        resume_step: int | None = None,
        members: list[int] | None = None,
        flush_seconds: float = 2.0,
    ) -> None:
        #: The ranks (of the first communicator) of the current one, in its order.
        self.members = list(range(comm.Get_size())) if members is None else list(members)
        self.ranks = int(attrs["ranks"]) if members is not None else comm.Get_size()
        self.rank = self.members[comm.Get_rank()]
        self.comm = track(comm.Dup())
        self.flush_seconds = flush_seconds
        self.journal = Journal(path, self.ranks)
        self.writer: FileWriter | None = None
        error = None
        if comm.Get_rank() == 0:
            try:
                self.writer = self._open(path, attrs, resume_step)
                self.writer.members = list(self.members)
            except (OSError, KeyError, ValueError) as exc:  # told to every rank, which would wait for rank 0
                error = f"rank 0 could not make the run file {partial_path(path)}: {exc}"
        error = self.comm.bcast(error)
        if error:
            raise RuntimeError(error)
        try:
            self._logs = self.journal.logs(self.rank)
            error = None
        except OSError as exc:
            error = f"rank {self.rank} cannot open its row logs in {self.journal.folder} ({exc})"
        errors = [e for e in self.comm.allgather(error) if e]  # after it, every rank's logs are open or failed
        if not errors:
            missing = self.comm.bcast(self.journal.missing() if self.writer else None)
            errors = (
                [f"rank 0 does not see the row logs of ranks {missing} in {self.journal.folder}"] if missing else []
            )
        if errors:
            raise RuntimeError("; ".join(errors) + ": the run file's folder must be one file system every rank sees")
        self._start_bookkeeping()

    def _start_bookkeeping(self) -> None:
        """What the recorder tracks from its start: on the root, the bytes of
        each rank's step log in the file, and the evaluated steps and
        membership rows in it (a rank may log one before a new root has read
        the logs: each is written once); the tables, the changes so far."""
        self._offsets = [0] * self.ranks
        self._evaluated: set[float] = set()
        self._membership = np.zeros((0, len(MEMBERSHIP_FIELDS)))
        if self.writer:
            with h5py.File(self.writer.partial, "r") as f:
                self._evaluated = set(f["eval"]["step"][:].tolist())
            self._membership = self.journal.membership()
        self._tables: dict[str, _Table] = {}
        self._changes = 0  # membership changes so far
        self._dead_members: set[int] = set()  # the root's record_dead_member rows
        self._last_flush = time.monotonic()

    @classmethod
    def joining(
        cls, comm: MPI.Intracomm, path: str, ranks: int, row: int, *, flush_seconds: float = 2.0
    ) -> RunRecorder:
        """The recorder of a replacement that took row ``row`` of the run
        file ``path`` (of ``ranks`` rows), on ``comm``, the members'
        communicator after the join: collective over it, the counterpart of
        the other members' :meth:`rebuild` (the root stays theirs).  Its
        rows go on in the row's logs, after those of the rank it replaces."""
        recorder = cls.__new__(cls)
        recorder.ranks, recorder.rank, recorder.flush_seconds = ranks, row, flush_seconds
        recorder.journal, recorder.writer = Journal(path, ranks), None
        recorder._logs = recorder.journal.continued_logs(row)
        recorder.members = comm.allgather(row)
        recorder.comm = track(comm.Dup())
        recorder._start_bookkeeping()
        return recorder

    def _open(self, path, attrs, resume_step):
        """Rank 0: the file (created, or brought up to date and reopened to
        resume), the logs' folder and head; the old logs cut at the step."""
        resuming = resume_step is not None and os.path.exists(partial_path(path))
        if resuming:
            caught_up = update_from_logs(path)
            if caught_up:
                caught_up.commit()
        else:
            self.journal.remove()  # an earlier run's under the same name
        writer = FileWriter.create(path, attrs, self.ranks, resume_step)
        os.makedirs(self.journal.folder, exist_ok=True)
        if resuming:
            self.journal.cut(resume_step)
        with h5py.File(writer.partial, "r") as f:
            head = dict(f.attrs)
        create_file(self.journal.head + ".tmp", head, self.ranks)
        os.replace(self.journal.head + ".tmp", self.journal.head)
        return writer

    @property
    def path(self) -> str | None:
        return self.writer.path if self.writer else None

    def record(self, step: int, **values: float) -> None:
        """This rank's measurements of ``step`` (the :data:`~wagma.results.schema.STEP_FIELDS`),
        into its log at once; the root rewrites the file when ``flush_seconds`` have passed."""
        self._logs[0].append((step, *_STEP_VALUES(values)))
        if self.writer and time.monotonic() - self._last_flush >= self.flush_seconds:
            self.flush()

    def record_tables(self, tables: Mapping[str, tuple[np.ndarray, list[str]]]) -> None:
        """On the root: the algorithm's ``sync/<name>`` tables as they stand
        (``name -> (rows, columns)``, :meth:`~wagma.algorithms.base.Algorithm.sync_tables`),
        whose rows only ever grow.  A table goes to the next flush the first
        time it is handed (empty or not) and again whenever it has grown, so
        a loop may hand them after every step, and a run that fails keeps
        them up to its last flush.  After a :meth:`rebuild` the rebuilt
        algorithm's tables start again from no rows: they follow the rows
        the table had before, or, where their columns differ (a column per
        rank), go to ``sync/NAME.K`` (K: the membership change's number, 1
        for the first).  Elsewhere: nothing."""
        if not self.writer:
            return
        for name, (rows, columns) in tables.items():
            rows, columns = np.asarray(rows, dtype=np.float64).reshape(-1, len(columns)), list(columns)
            table = self._tables.get(name)
            if table is None or (not table.handed and columns != table.columns):
                stored = name if table is None else f"{name}.{self._changes}"
                table = self._tables[name] = _Table(stored, columns, np.zeros((0, len(columns))))
            if not table.handed or len(rows) > len(table.rows):
                table.rows, table.handed = rows.copy(), True
                self.writer.set_table(table.stored, np.concatenate([table.earlier, rows]), columns)

    def record_eval(self, replica_accuracy: ArrayLike | None = None, **values: float) -> None:
        """One evaluation (the :data:`~wagma.results.schema.EVAL_FIELDS`), into
        this rank's log; on the root into the file at the next flush.  Every
        rank keeps the evaluations it recorded, so a rank that becomes the
        root at a :meth:`rebuild` writes them all (each evaluated step once:
        where every rank evaluates, each records the same).
        ``replica_accuracy``: one per member, in the current communicator's
        order (stored by row, NaN for the ranks that left)."""
        replicas = np.full(self.ranks, np.nan)
        if replica_accuracy is not None:
            given = np.asarray(replica_accuracy, dtype=np.float64).ravel()
            if len(given) != len(self.members):
                raise ValueError(
                    f"replica_accuracy must have one value per rank of the run ({len(self.members)}), got {len(given)}"
                )
            replicas[self.members] = given
        self._logs[1].append((*(values[k] for k in EVAL_FIELDS), *replicas))
        if self.writer and values["step"] not in self._evaluated:
            self._evaluated.add(values["step"])
            self.writer.add_eval(values, None if replica_accuracy is None else replicas)

    def record_membership(
        self, *, step: int, clock: float, left: Collection[int], noticed: str, recovery_s: float
    ) -> None:
        """A membership change, after :meth:`rebuild`, on every member with the same values.

        Args:
            step: the first step the members run after the change.
            clock: the training clock (seconds) when it was noticed.
            left: the ranks that left, numbered in the recorder's first
                communicator (their rows of ``steps/``).
            noticed: how: a name of :data:`~wagma.results.schema.NOTICED`.
            recovery_s: seconds from noticing it to going on.

        One row per rank that left goes to ``membership/`` (with
        ``ranks_after``, the members now), in this rank's log and on the
        root into the file at once; on the root, a rank it recorded already
        as a dead member (:meth:`record_dead_member`: ensemble_sync went on
        without it, and this change is the shrink that leaves it out) is
        not recorded again, since a rank leaves once.

        Raises:
            ValueError: a name ``noticed`` does not know, a rank out of
                range or still a member (call :meth:`rebuild` first), no rank.
        """
        code = _noticed_code(noticed)
        left = sorted(int(r) for r in left)
        if not left or any(not 0 <= r < self.ranks or r in self.members for r in left):
            raise ValueError(
                f"left must name ranks in [0, {self.ranks - 1}] that are no longer members "
                f"(members: {self.members}; call rebuild() with the survivors' communicator first), got {left}"
            )
        left = [r for r in left if r not in self._dead_members]
        if left:
            self._add_membership([[step, clock, r, code, recovery_s, len(self.members)] for r in left])

    def record_join(self, *, step: int, clock: float, joined: Collection[int], recovery_s: float) -> None:
        """Replacements took rows ``joined`` (:mod:`wagma.healing`), after
        :meth:`rebuild` (:meth:`joining` on the newcomers), on every member
        with the same values: one ``joined`` row per row taken; ``joined``
        empty: processes started as replacements were refused, one
        ``refused`` row (``left`` -1).  ``step``: the first step every
        member runs together; ``recovery_s``: from the spawn to every
        member ready.

        Raises:
            ValueError: a row out of range or not a member now.
        """
        joined = sorted(int(r) for r in joined)
        if any(not 0 <= r < self.ranks or r not in self.members for r in joined):
            raise ValueError(
                f"joined must name rows in [0, {self.ranks - 1}] that are members now "
                f"(members: {self.members}), got {joined}"
            )
        if not joined:
            self._add_membership([[step, clock, -1, NOTICED["refused"], recovery_s, len(self.members)]])
            return
        self._add_membership([[step, clock, r, NOTICED["joined"], recovery_s, len(self.members)] for r in joined])

    def record_dead_member(self, *, step: int, clock: float, rank: int, noticed: str, recovery_s: float) -> None:
        """On the root: member ``rank`` (its row) died and the others went on
        without it, with no shrink (ensemble_sync's coordinator stops waiting
        for it): one ``membership/`` row, as :meth:`record_membership` writes
        them (``ranks_after``: the members still alive).  The rank stays a
        member of the recorder, its rows ending where it died; :meth:`close`
        is told it is dead.  A rank already recorded is not recorded again;
        elsewhere: nothing."""
        if not self.writer or rank in self._dead_members:
            return
        code = _noticed_code(noticed)
        self._dead_members.add(rank)
        self._add_membership([[step, clock, rank, code, recovery_s, len(self.members) - len(self._dead_members)]])

    def _add_membership(self, rows):
        """``membership/`` rows into this rank's log and, on the root, into the file at once."""
        rows = np.array(rows, dtype=float)
        for row in rows:
            self._logs[2].append(row)
        if self.writer:
            self._membership = np.unique(np.concatenate([self._membership, rows]), axis=0)
            self.writer.set_membership(self._membership)
            self.flush()

    def _read_logs(self):
        for rank in range(self.ranks):
            rows, self._offsets[rank] = self.journal.rows(rank, self._offsets[rank])
            self.writer.add_rows(rank, rows)

    def flush(self) -> None:
        """The root: write every rank's rows since the last flush, and what
        it recorded (local; the others: nothing)."""
        if self.writer:
            self._read_logs()
            self.writer.flush()
            self._last_flush = time.monotonic()

    def rebuild(self, comm: MPI.Intracomm) -> None:
        """Go on over ``comm``, the members' new communicator after a
        membership change (ULFM: ``Revoke``, then ``Shrink`` of the old
        one); collective over it, before :meth:`record_membership`.

        Each rank keeps its row; ``comm``'s ranks are mapped to the first
        communicator's by an allgather.  ``comm``'s rank 0 becomes the root:
        if it was not, it writes the partial file afresh from the logs (the
        head's attributes, every rank's rows, the dead ranks' up to their
        death, every evaluation and membership change any rank recorded)
        and the old file's ``sync/`` tables where it can read them, under a
        temporary name put in the file's place (the old root may have died
        while writing it).  A root that is no longer rank 0 writes what it
        has first.  The duplicate of the old communicator is left to
        ``MPI_Finalize`` (freeing it would take its dead ranks)."""
        if self.writer and comm.Get_rank() != 0:
            self.flush()
            self.writer = None
        self.members = comm.allgather(self.rank)
        self.comm = track(comm.Dup())
        self._changes += 1
        if comm.Get_rank() != 0:
            return
        if self.writer is None:
            tables = read_tables(partial_path(self.journal.path))
            self.writer, self._offsets = rewrite_from_logs(self.journal, self.members, tables)
            self._membership = self.journal.membership()
            self._evaluated = set(self.journal.evaluations()[:, 0].tolist())
            self._tables = {}
            for stored in sorted(tables, key=_change_of):  # NAME.K after NAME: the latest one is continued
                rows, columns = tables[stored]
                self._tables[stored.split(".")[0]] = _Table(stored, columns, rows)
        self.writer.members = list(self.members)
        for table in self._tables.values():
            table.earlier = np.concatenate([table.earlier, table.rows]) if table.rows.size else table.earlier
            table.rows, table.handed = np.zeros((0, len(table.columns))), False
        self.flush()

    def close(self, status: str, dead: Collection[int] = (), attrs: Mapping[str, Any] | None = None) -> str | None:
        """Collective over the living members: every rank closes its logs
        and tells the root, which writes every rank's remaining rows, the
        :func:`~wagma.results.summary.summarize` figures and ``status``;
        ``"complete"`` renames the file to its final name and removes the
        logs (any other status keeps them, for a resumed run).  ``dead``:
        ranks that died while members (ULFM without a rebuild: ensemble_sync),
        not waited for; their rows end where they died.  The root attribute
        ``dead_ranks`` lists them and the ranks that left at a rebuild.
        ``attrs``: more root attributes (the root's).  Returns the path
        written (the root) or None."""
        for log in self._logs:
            log.close()
        dead = set(dead)
        if not self.writer:
            self.comm.Send(np.zeros(0), dest=0, tag=_CLOSED)
            return None
        for index, rank in enumerate(self.members[1:], start=1):
            if rank not in dead:
                self.comm.Recv(np.zeros(0), source=index, tag=_CLOSED)
        self._read_logs()
        gone = sorted(dead | (set(range(self.ranks)) - set(self.members)))
        self.writer.members = [r for r in self.members if r not in dead]
        summary = {"dead_ranks": len(gone)} if gone else None
        self.writer.flush(attrs={**(attrs or {}), "dead_ranks": json.dumps(gone)}, summary=summary)
        self.writer.flush(status=status, summary=summarize(load_run(self.writer.partial, logs=False)))
        if status != "complete":
            return self.writer.partial
        os.replace(self.writer.partial, self.writer.path)
        self.journal.remove()
        return self.writer.path

    def abandon(self, status: str = "failed") -> None:
        """After an error, without communicating: the root writes what the
        logs hold and marks the partial file with ``status``."""
        if self.writer:
            self._read_logs()
            self.writer.flush(status=status)
