"""One HDF5 file per training run: its schema, how it is recorded and written, how it is read and summarized.

``schema`` (what the file holds, field by field), ``journal`` (every rank's
append-only logs beside the file, which outlive the rank that writes it),
``recorder`` (:class:`~.recorder.RunRecorder`: every rank logs its rows,
the root, which can change, writes them into the file as the run goes),
``writer`` (the root's appending writer; :func:`~.writer.write_run`, a whole
file at once), ``rewrite`` (the file written afresh from the logs: by a new
root, a resumed run, and :func:`~.rewrite.complete_run`, ``python -m
wagma.results complete``, after a job died), ``reader``
(:func:`~.reader.load_run`, :class:`~.reader.Run`) and ``summary``
(:func:`~.summary.summarize`: throughput, accuracy, stale fraction,
membership changes).
"""

from .reader import Run, load_run
from .recorder import RunRecorder
from .rewrite import complete_run
from .schema import (
    EVAL_FIELDS,
    MEMBERSHIP_FIELDS,
    NOTICED,
    SCHEMA,
    STEP_FIELDS,
    is_partial,
    partial_path,
    rows_path,
)
from .summary import last_epoch_accuracy, straggler_summary, summarize
from .writer import write_run

__all__ = [
    "EVAL_FIELDS",
    "MEMBERSHIP_FIELDS",
    "NOTICED",
    "SCHEMA",
    "STEP_FIELDS",
    "Run",
    "RunRecorder",
    "complete_run",
    "is_partial",
    "last_epoch_accuracy",
    "load_run",
    "partial_path",
    "rows_path",
    "straggler_summary",
    "summarize",
    "write_run",
]
