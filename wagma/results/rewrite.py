"""Writing a partial run file afresh from the row logs beside it: for a new writer, a resumed run, a job that died.

Every writer here makes a new copy under a temporary name and puts it in
the partial file's place in one ``os.replace``, so the file is readable
whenever this process dies too.  :func:`rewrite_from_logs` trusts nothing
of the old file but its ``sync/`` tables (its writer may have died in the
middle of writing it); :func:`update_from_logs` starts from the old file
where it can be read (a run begun before the logs existed has rows only
there) and from the logs' head where it cannot; :func:`complete_run` is the
command ``python -m wagma.results complete``.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Collection, Mapping

import h5py
import numpy as np

from .journal import Journal
from .reader import load_run
from .schema import EVAL_FIELDS, MEMBERSHIP_FIELDS, gone_rows, is_partial, partial_path
from .summary import summarize
from .writer import FileWriter

__all__ = ["DIED", "complete_run", "read_tables", "rewrite_from_logs", "update_from_logs"]

logger = logging.getLogger(__name__)

#: The status :func:`complete_run` gives a file that no rank closed.
DIED = "failed: a rank died"

Tables = Mapping[str, tuple[np.ndarray, list[str]]]


def read_tables(partial: str) -> dict[str, tuple[np.ndarray, list[str]]]:
    """The ``sync/`` tables of the partial file (stored name -> rows,
    columns); none, with a warning, where it cannot be read (a writer killed
    while it wrote it)."""
    try:
        with h5py.File(partial, "r") as f:
            if "sync" not in f:
                return {}
            return {name: (t[:], json.loads(t.attrs["columns"])) for name, t in f["sync"].items()}
    except (OSError, KeyError, ValueError) as error:
        logger.warning("the sync tables of %s are lost: it cannot be read (%s)", partial, error)
        return {}


def _write_logs(writer: FileWriter, journal: Journal) -> list[int]:
    """Every rank's step rows into ``writer``'s file, a rank at a time (its
    log is the memory it takes); returns the byte offset read to in each log."""
    offsets = []
    for rank in range(journal.ranks):
        rows, offset = journal.rows(rank)
        writer.add_rows(rank, rows)
        writer.flush()
        offsets.append(offset)
    return offsets


def _evaluations(writer: FileWriter, rows: np.ndarray) -> None:
    for row in rows:
        replicas = row[len(EVAL_FIELDS) :]
        writer.add_eval(dict(zip(EVAL_FIELDS, row)), None if np.isnan(replicas).all() else replicas)


def rewrite_from_logs(journal: Journal, members: Collection[int], tables: Tables) -> tuple[FileWriter, list[int]]:
    """The partial file beside ``journal`` written afresh by a new writer (the
    rank 0 of a rebuilt communicator) from the logs alone: the head's
    attributes, every rank's rows (the dead ranks' up to their death),
    every evaluation and membership change any rank recorded, and
    ``tables`` (:func:`read_tables` of the old file).  ``members``: the
    ranks that ``written`` waits for.  Returns the writer, now writing the
    partial file, and the byte offset read to in each rank's step log."""
    writer = FileWriter.from_head(journal.path, journal.head)
    writer.members = sorted(members)
    offsets = _write_logs(writer, journal)
    _evaluations(writer, journal.evaluations())
    writer.set_membership(journal.membership())
    for name, (rows, columns) in tables.items():
        writer.set_table(name, rows, columns)
    writer.flush()
    writer.commit()
    return writer, offsets


def _file_content(partial: str) -> tuple[np.ndarray, np.ndarray] | None:
    """``(evaluations, membership rows)`` of a readable partial file, or None."""
    try:
        with h5py.File(partial, "r") as f:
            evals = np.column_stack([*(f["eval"][k][:] for k in EVAL_FIELDS), f["eval"]["replica_accuracy"][:]])
            membership = (
                np.column_stack([f["membership"][k][:] for k in MEMBERSHIP_FIELDS])
                if "membership" in f
                else np.zeros((0, len(MEMBERSHIP_FIELDS)))
            )
            return evals, membership
    except (OSError, KeyError, ValueError) as error:
        logger.warning("%s cannot be read (%s): it is written afresh from the logs beside it", partial, error)
        return None


def update_from_logs(path: str, *, gone: bool = False) -> FileWriter | None:
    """A new copy of the partial file of ``path`` brought up to date with
    the logs beside it: the rows, evaluations and membership changes it
    lacks; where the file cannot be read, written afresh from the logs'
    head (its tables are lost).  ``gone``: every rank has left (the job
    died), so ``written`` becomes the furthest step any rank reached.
    Returns its writer, to be :meth:`~wagma.results.writer.FileWriter.commit`-ted,
    or None where there are no logs.

    Raises:
        OSError: the file cannot be read and there are no logs to write it from.
    """
    partial = partial_path(path)
    content = _file_content(partial) if os.path.exists(partial) else None
    journal = Journal.beside(path)
    if journal is None:
        if content is None and os.path.exists(partial):
            raise OSError(f"{partial} cannot be read, and there are no row logs beside it to write it afresh from")
        return None
    evals, membership = journal.evaluations(), journal.membership()
    if content is None:
        writer = FileWriter.from_head(path, journal.head)
    else:
        writer = FileWriter.from_copy(path)
        file_evals, file_membership = content
        evals = np.concatenate([file_evals, evals])
        evals = evals[np.unique(evals[:, 0], return_index=True)[1]]
        membership = np.concatenate([file_membership, membership])
        membership = np.unique(membership, axis=0) if len(membership) else membership
        writer.clear_evals()
    left = gone_rows(membership)
    writer.members = [] if gone else [r for r in range(journal.ranks) if r not in left]
    _write_logs(writer, journal)
    _evaluations(writer, evals)
    writer.set_membership(membership)
    writer.flush()
    return writer


def complete_run(path: str, status: str = DIED) -> str:
    """``python -m wagma.results complete``: after a job ended without
    closing its run file (the launcher killed every rank), write the rows
    of the logs beside it into the partial file, its summary, and
    ``status`` where the file still says ``running`` (a file a rank closed,
    ``stopped`` or ``failed``, keeps its own), in a new copy put in its
    place.  The logs stay, so that a resumed run goes on from them and a
    second call changes nothing.  ``path``: the run file's final or partial
    name.  Returns the partial file's path, or the final file's where the
    run completed (then nothing is done).

    Raises:
        FileNotFoundError: neither the partial file nor its logs are there.
    """
    if is_partial(path):
        path = path[: -len(".partial.h5")] + ".h5"
    partial = partial_path(path)
    if os.path.exists(path) and not os.path.exists(partial):
        return path
    writer = update_from_logs(path, gone=True)
    if writer is None:
        if not os.path.exists(partial):
            raise FileNotFoundError(f"no run file to complete: neither {partial} nor its row logs are there")
        writer = FileWriter.from_copy(path)
        writer.members = []
    with h5py.File(writer.file, "r") as f:
        running = f.attrs.get("status") == "running"
    writer.flush(status=status if running else None, summary=summarize(load_run(writer.file)))
    writer.commit()
    return partial
