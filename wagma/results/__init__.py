"""One HDF5 file per training run: its schema, how it is recorded and written, how it is read and summarized.

``schema`` (what the file holds, field by field), ``recorder``
(:class:`~.recorder.RunRecorder`: every rank's rows, collected on rank 0 as the run
goes), ``writer`` (the root's appending writer; :func:`~.writer.write_run`, a whole
file at once), ``reader`` (:func:`~.reader.load_run`, :class:`~.reader.Run`) and ``summary``
(:func:`~.summary.summarize`: throughput, accuracy, stale fraction).
"""

from .reader import Run, load_run
from .recorder import RunRecorder
from .schema import EVAL_FIELDS, SCHEMA, STEP_FIELDS, is_partial, partial_path
from .summary import last_epoch_accuracy, straggler_summary, summarize
from .writer import write_run

__all__ = [
    "EVAL_FIELDS",
    "SCHEMA",
    "STEP_FIELDS",
    "Run",
    "RunRecorder",
    "is_partial",
    "last_epoch_accuracy",
    "load_run",
    "partial_path",
    "straggler_summary",
    "summarize",
    "write_run",
]
