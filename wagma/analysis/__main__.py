"""Command line: compare run files in a table, write CSV and figures.

``python -m wagma.analysis results/ [--baseline allreduce_sgd] [--target-accuracy 0.9]
[--skip-steps N] [--plot DIR] [--csv FILE] [--markdown]``
"""

import argparse
import logging
import sys
from collections.abc import Sequence

from collectives.logs import configure_logging

from .files import read_runs
from .plots import plot_all
from .table import compare, format_table, write_csv

__all__ = ["main"]

logger = logging.getLogger("wagma.analysis")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=".venv/bin/python -m wagma.analysis",
        description="Compare training runs (HDF5 run files): throughput, speedup, accuracy, waiting.",
    )
    parser.add_argument(
        "paths",
        nargs="+",
        metavar="FILE_OR_DIR",
        help="run files, or directories searched for *.h5 (*.partial.h5 included)",
    )
    parser.add_argument(
        "--baseline",
        default="allreduce_sgd",
        help="algorithm the speedup is measured against, at the same P, imbalance, "
        "compute, model, dataset and batch size: its runs labelled so (the plain "
        "algorithm), else all its variants; or a variant's label, 'sgp (2n)' "
        "(default %(default)s)",
    )
    parser.add_argument(
        "--target-accuracy",
        type=float,
        default=0.9,
        help="accuracy (a fraction) for the time-to-accuracy column (default %(default)s)",
    )
    parser.add_argument(
        "--skip-steps",
        type=int,
        default=None,
        metavar="N",
        help="recompute throughput leaving out the first N steps (warm-up)",
    )
    parser.add_argument("--plot", metavar="DIR", help="write PNG figures into DIR")
    parser.add_argument("--csv", metavar="FILE", help="write the rows as CSV (seconds, fractions)")
    parser.add_argument("--markdown", action="store_true", help="print a GitHub markdown table")
    args = parser.parse_args(argv)
    configure_logging()
    if not 0 < args.target_accuracy <= 1:
        parser.error(f"--target-accuracy must be a fraction in (0, 1], got {args.target_accuracy}")
    if args.skip_steps is not None and args.skip_steps < 0:
        parser.error(f"--skip-steps must be >= 0, got {args.skip_steps}")

    runs, skipped = read_runs(args.paths)
    for path, reason in skipped:
        logger.warning("skipping %s: %s", path, reason)
    if not runs:
        logger.error("no run file could be read")
        return 1
    rows = compare(runs, baseline=args.baseline, target_accuracy=args.target_accuracy, skip=args.skip_steps)
    if not any(args.baseline in (row["algorithm"], row["label"]) for row in rows):
        logger.info("no %s run among these files: no speedups", args.baseline)
    print(format_table(rows, markdown=args.markdown))
    written = []
    if args.csv:
        write_csv(rows, args.csv)
        written.append(args.csv)
    if args.plot:
        written += plot_all(runs, rows, args.plot, target_accuracy=args.target_accuracy)
    for path in written:  # off the table's stream when it is markdown to paste
        print(f"wrote {path}", file=sys.stderr if args.markdown else sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
