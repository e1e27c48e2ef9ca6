"""The main job and the throughput sweep (docs/main-job.md): one ``mpiexec`` run per algorithm, then the table.

``.venv/bin/python -m experiments.campaign main``
    8 ranks train an MLP on scikit-learn's digits with the WAGMA paper's
    imbalance (2 random ranks delayed 320 ms at every step), once per
    algorithm: Allreduce-SGD, local SGD, WAGMA-SGD, D-PSGD, AD-PSGD, SGP,
    eager-SGD; same seed, epochs and learning-rate schedule (warm-up for an
    epoch, then constant) for all.

``.venv/bin/python -m experiments.campaign sweep``
    Throughput at 4, 8, 16, 32 ranks with emulated compute (no forward or
    backward: each step sleeps; full-size ResNet-20 buffers are communicated),
    the same 2 x 320 ms imbalance; what the paper's Figure 4 measures, scaled
    to fit on a workstation (see ``--compute-ms``).

Each writes its run files, ``table.md`` (the ``wagma.analysis`` table) and
the figures (``wagma.analysis --plot``) into ``--out-dir`` and prints the
table.  ``--out-dir`` defaults to a fresh ``runs/CAMPAIGN-YYYYmmdd-HHMMSS``
(``runs/`` is git-ignored), so a user's run never overwrites the reference
results committed in ``results/main`` and ``results/sweep``; refreshing those
is done on purpose, with ``--out-dir results/main`` (``make main
OUT=results/main``), which replaces the run files, the table and the figures
together.  Every run is a separate ``mpiexec`` job, launched with the
``mpiexec`` next to this Python (the MPI wheel's) unless ``MPIEXEC`` names
another, and the flags its library needs (:mod:`experiments.mpirun`); each
job's command line is printed as it can be pasted to run it again.
"""

import argparse
import os
import shlex
import subprocess
import sys
import time

from .mpirun import find_mpiexec, mpiexec_command
from .options import HelpFormatter

__all__ = ["MAIN_ALGORITHMS", "default_out_dir", "main"]

MAIN_ALGORITHMS = ("allreduce_sgd", "local_sgd", "wagma", "dpsgd", "adpsgd", "sgp", "eager_sgd")
PAPER_IMBALANCE = "random:k=2,ms=320"


def _shown(path):
    """``path`` as a command line shows it: relative to the working directory when inside it."""
    relative = os.path.relpath(path)
    return relative if not relative.startswith(os.pardir) else path


def default_out_dir(campaign, now=None):
    """``runs/CAMPAIGN-YYYYmmdd-HHMMSS``: a fresh, git-ignored folder per invocation."""
    return os.path.join("runs", f"{campaign}-{time.strftime('%Y%m%d-%H%M%S', time.localtime(now))}")


def _run(mpiexec, ranks, algo, out, extra):
    launch = mpiexec_command(ranks, mpiexec)
    command = [*launch, sys.executable, "-m", "experiments.train", "--algo", algo, "--out", out, *extra]
    print(f"\n$ {shlex.join([_shown(mpiexec), *launch[1:], _shown(sys.executable), *command[len(launch) + 1:]])}",
          flush=True)
    start = time.monotonic()
    subprocess.run(command, check=True)
    print(f"{algo} on {ranks} ranks: {time.monotonic() - start:.0f} s", flush=True)


def _table(out_dir, files, extra=()):
    """``table.md`` and the figures of ``files`` in ``out_dir``; prints the table."""
    command = [sys.executable, "-m", "wagma.analysis", *files, "--baseline", "allreduce_sgd", *extra]
    table = subprocess.run([*command, "--markdown"], check=True, capture_output=True, text=True).stdout
    with open(os.path.join(out_dir, "table.md"), "w") as f:
        f.write(table)
    subprocess.run([*command, "--plot", out_dir], check=True)


def main(argv=None):
    parser = argparse.ArgumentParser(prog=".venv/bin/python -m experiments.campaign", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="campaign", required=True)
    m = sub.add_parser("main", help="8 ranks, digits, the paper's imbalance, every algorithm",
                       formatter_class=HelpFormatter)
    m.add_argument("--ranks", type=int, default=8, help="ranks of every run")
    m.add_argument("--epochs", type=int, default=20, help="epochs of every run")
    m.add_argument("--decay-epochs", default="",
                   help="epochs of step decay of the learning rate, x0.1 at each [none]")
    m.add_argument("--imbalance", default=PAPER_IMBALANCE,
                   help="experiments.train's --imbalance (the WAGMA paper's: 2 random ranks, 320 ms)")
    m.add_argument("--algos", default=",".join(MAIN_ALGORITHMS), help="comma-separated algorithms")
    m.add_argument("--out-dir", default=None,
                   help="run files, table.md and figures [a fresh runs/main-YYYYmmdd-HHMMSS]; "
                        "results/main refreshes the committed reference results")
    m.add_argument("--target-accuracy", type=float, default=0.95,
                   help="accuracy (a fraction) of the table's time-to-accuracy column")
    s = sub.add_parser("sweep", help="emulated-compute throughput sweep over rank counts",
                       formatter_class=HelpFormatter)
    s.add_argument("--ranks", default="4,8,16,32", help="comma-separated rank counts")
    s.add_argument("--steps", type=int, default=50, help="steps of every run")
    s.add_argument("--compute-ms", type=float, default=600.0,
                   help="compute time of a step before delays (the paper, balanced: 1.52 steps/s "
                        "for ResNet-50 at batch 128 per P100)")
    s.add_argument("--imbalance", default=PAPER_IMBALANCE, help="experiments.train's --imbalance")
    s.add_argument("--model", default="resnet20", help="whose buffers are communicated")
    s.add_argument("--algos", default=",".join(MAIN_ALGORITHMS), help="comma-separated algorithms")
    s.add_argument("--out-dir", default=None,
                   help="run files, table.md and figures [a fresh runs/sweep-YYYYmmdd-HHMMSS]; "
                        "results/sweep refreshes the committed reference results")
    args = parser.parse_args(argv)
    from wagma.algorithms import ALGORITHMS     # after parsing: --help needs no torch
    algos = [a for a in args.algos.split(",") if a]
    unknown = sorted(set(algos) - set(ALGORITHMS))
    if unknown or not algos:
        parser.error(f"--algos: unknown {', '.join(unknown) or 'nothing given'}; "
                     f"accepted: {', '.join(sorted(ALGORITHMS))}")
    mpiexec = find_mpiexec()
    if not mpiexec:
        parser.error("no mpiexec found next to this Python or on PATH; set MPIEXEC")
    out_dir = args.out_dir or default_out_dir(args.campaign)
    os.makedirs(out_dir, exist_ok=True)
    files = []
    if args.campaign == "main":
        decay = ["--decay-epochs", args.decay_epochs] if args.decay_epochs else []
        for algo in algos:
            out = os.path.join(out_dir, f"{algo}_p{args.ranks}.h5")
            _run(mpiexec, args.ranks, algo, out, ["--dataset", "digits", "--model", "mlp",
                                                  "--epochs", str(args.epochs), *decay,
                                                  "--imbalance", args.imbalance, "--no-progress"])
            files.append(out)
        _table(out_dir, files, ["--target-accuracy", str(args.target_accuracy)])
    else:
        for ranks in [int(r) for r in args.ranks.split(",")]:
            for algo in algos:
                out = os.path.join(out_dir, f"{algo}_p{ranks}.h5")
                _run(mpiexec, ranks, algo, out, ["--dataset", "synthetic", "--model", args.model,
                                                 "--compute", "emulate", "--compute-ms", str(args.compute_ms),
                                                 "--max-steps", str(args.steps), "--batch-size", "128",
                                                 "--epochs", str(args.steps), "--imbalance", args.imbalance,
                                                 "--no-progress"])
                files.append(out)
        _table(out_dir, files, ["--skip-steps", "5"])
    print(f"\nwrote the run files, table.md and the figures to {_shown(out_dir)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
