"""``python -m experiments.campaign diloco``: DiLoCo, Streaming DiLoCo and WAGMA-SGD with and without an
outer optimizer, each with float32 and int8 on the wire, on the accuracy task over seeds and on the main job."""

import os

import numpy as np

from wagma.analysis.table import compare, render

from .jobs import clear_run, run_training

__all__ = ["DILOCO_VARIANTS", "run_diloco", "side_by_side"]

#: The variants, in pairs without and with int8: H = 10 for both DiLoCos, WAGMA-SGD's tau, so that
#: every variant averages globally as often; Streaming DiLoCo in two fragments (the MLP's three
#: layers), each overlapped by one step; the outer optimizer DiLoCo's (lr 0.7, Nesterov momentum 0.9).
DILOCO_VARIANTS = (
    "diloco:period=10",
    "diloco:period=10:compression=int8",
    "streaming_diloco:period=10:fragments=2:overlap-steps=1",
    "streaming_diloco:period=10:fragments=2:overlap-steps=1:compression=int8",
    "wagma",
    "wagma:compression=int8",
    "wagma:outer-lr=0.7:outer-momentum=0.9",
    "wagma:outer-lr=0.7:outer-momentum=0.9:compression=int8",
)

#: The columns of :func:`side_by_side`.
SIDE_BY_SIDE = (
    "algorithm",
    "runs",
    "last-epoch acc %",
    "final acc %",
    "time to target (s)",
    "samples/s",
    "MB sent/rank",
)


def _stats(values, scale=1.0, spec=".1f"):
    """``mean +- half-range`` of the values given (None ones left out), or ``-``."""
    values = np.asarray([v for v in values if v is not None], dtype=np.float64) * scale
    if not values.size:
        return "-"
    half = (values.max() - values.min()) / 2
    return f"{values.mean():{spec}} +- {half:{spec}}" if values.size > 1 else f"{values.mean():{spec}}"


def side_by_side(files: list[str], target: float) -> str:
    """One row per variant (run label) over its runs: the mean and
    half-range of the last epoch's accuracy and of the final one, the time
    to ``target`` (runs that never reach it left out, their count said),
    throughput, and the bytes each rank sent to average (MB)."""
    groups: dict[str, list[dict]] = {}
    for row in compare(files, target_accuracy=target):
        groups.setdefault(row["label"], []).append(row)
    cells = [[*SIDE_BY_SIDE[:4], f"time to {target * 100:g}% (s)", *SIDE_BY_SIDE[5:]]]
    for label, rows in groups.items():
        reached = [r["time_to_target"] for r in rows if r["time_to_target"] is not None]
        time = _stats(reached) + ("" if len(reached) == len(rows) else f" ({len(rows) - len(reached)} never)")
        cells.append(
            [
                label,
                str(len(rows)),
                _stats([r["last_epoch_accuracy"] for r in rows], 100),
                _stats([r["final_accuracy"] for r in rows], 100),
                time,
                _stats([r["throughput"] for r in rows]),
                _stats([r["bytes_sent_per_rank"] for r in rows], 1e-6, ".2f"),
            ]
        )
    return render(cells, ["<", ">", ">", ">", ">", ">", ">"], markdown=True)


def _write(out_dir: str, name: str, text: str) -> None:
    with open(os.path.join(out_dir, name), "w") as f:
        f.write(text + "\n")
    print(f"\n{name}:\n{text}", flush=True)


def run_diloco(args, mpiexec, out_dir, variants):
    """Every variant on ``args.ranks`` ranks with the paper's imbalance: the
    accuracy task (``experiments.reproduce``'s, its global batch) for each
    of ``args.seeds``, into ``out_dir/accuracy``, and the main job (digits,
    ``args.epochs``), into ``out_dir/main`` (``args.tasks``: which of the two);
    a side-by-side table in each of every run file there (``args.tabulate``:
    the tables alone)."""
    from .reproduce.accuracy_claims import ACCURACY_TASK, GLOBAL_BATCH  # which imports the campaign's module

    tasks = {
        "accuracy": (
            [*ACCURACY_TASK, "--batch-size", str(GLOBAL_BATCH // args.ranks)],
            args.seeds,
            args.accuracy_target,
        ),
        "main": (["--dataset", "digits", "--model", "mlp", "--epochs", str(args.epochs)], [0], args.main_target),
    }
    for task, (flags, seeds, target) in tasks.items():
        if task not in args.tasks:
            continue
        folder = os.path.join(out_dir, task)
        os.makedirs(folder, exist_ok=True)
        for name, algo, extra in [] if args.tabulate else variants:
            for seed in seeds:
                out = os.path.join(folder, f"{name}_p{args.ranks}_seed{seed}.h5")
                clear_run(out)
                run_training(
                    mpiexec,
                    args.ranks,
                    algo,
                    out,
                    [*flags, "--imbalance", args.imbalance, "--seed", str(seed), *extra],
                )
        # Every run file of the folder, the variants in the order given.
        order = {name: i for i, (name, _, _) in enumerate(variants)}
        files = sorted(
            (os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".h5")),
            key=lambda path: (order.get(os.path.basename(path).rsplit(f"_p{args.ranks}_", 1)[0], len(order)), path),
        )
        _write(folder, "table.md", side_by_side(files, target))
