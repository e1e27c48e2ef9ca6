"""Repeated runs over seeds (``experiments.campaign seeds``): each variant's accuracy with its spread."""

import os

from wagma.analysis.spread import format_spread, spread_rows
from wagma.analysis.table import compare

from .jobs import clear_run, run_training

__all__ = ["EAGER_READINGS", "run_seeds"]

#: The default variants: eager-SGD's readings beside Allreduce-SGD.  The
#: first ceil(P/2) arrivals ("half") with each late reading, then the
#: authors' code: the majority's random activator, and solo with its
#: limiter, both dropping late gradients.
EAGER_READINGS = (
    "allreduce_sgd",
    "eager_sgd:quorum=half:late=accumulate",
    "eager_sgd:quorum=half:late=newest",
    "eager_sgd:quorum=half:late=drop",
    "eager_sgd",
    "eager_sgd:quorum=solo",
)


def run_seeds(args, mpiexec, out_dir, variants):
    """Every variant ``args.repeats`` times for each of ``args.seeds`` on
    ``args.ranks`` ranks; writes the run files and ``table.md`` (the
    :func:`~wagma.analysis.spread.format_spread` table) into ``out_dir``
    and prints the table."""
    files = []
    for name, algo, flags in variants:
        for seed in args.seeds:
            for repeat in range(1, args.repeats + 1):
                out = os.path.join(out_dir, f"{name}_p{args.ranks}_seed{seed}_run{repeat}.h5")
                clear_run(out)
                run_training(
                    mpiexec,
                    args.ranks,
                    algo,
                    out,
                    [
                        "--dataset",
                        args.dataset,
                        "--model",
                        args.model,
                        "--epochs",
                        str(args.epochs),
                        "--eval-every",
                        f"{args.eval_every:g}",
                        "--imbalance",
                        args.imbalance,
                        "--seed",
                        str(seed),
                        *flags,
                    ],
                )
                files.append(out)
    order = {path: i for i, path in enumerate(files)}
    rows = sorted(compare(files), key=lambda row: order[row["file"]])  # the variants as given
    table = format_spread(spread_rows(rows), markdown=True)
    with open(os.path.join(out_dir, "table.md"), "w") as f:
        f.write(table + "\n")
    print("\n" + table, flush=True)
