"""Comparing training runs: tables and figures from the HDF5 run files (``python -m wagma.analysis``).

From a notebook::

    from wagma.analysis import compare, format_table, read_runs
    runs, skipped = read_runs(["results/"])
    rows = compare(runs, baseline="allreduce_sgd", target_accuracy=0.75, skip=10)
    print(format_table(rows))
"""

from .files import find_run_files, is_partial, read_runs
from .frame import to_dataframe
from .plots import plot_accuracy, plot_all, plot_throughput, plot_waits
from .table import (
    COLUMNS,
    ROW_FIELDS,
    baseline_key,
    compare,
    format_table,
    mean_throughput,
    run_label,
    time_to_accuracy,
    write_csv,
)

__all__ = [
    "COLUMNS",
    "ROW_FIELDS",
    "baseline_key",
    "compare",
    "find_run_files",
    "format_table",
    "is_partial",
    "mean_throughput",
    "plot_accuracy",
    "plot_all",
    "plot_throughput",
    "plot_waits",
    "read_runs",
    "run_label",
    "time_to_accuracy",
    "to_dataframe",
    "write_csv",
]
