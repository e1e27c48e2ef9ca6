"""The README's experiments: one ``mpiexec`` run per algorithm, then the comparison table.

``python -m experiments.campaign main``
    8 ranks train an MLP on scikit-learn's digits with the WAGMA paper's
    imbalance (2 random ranks delayed 320 ms at every step), once per
    algorithm: Allreduce-SGD, local SGD, WAGMA-SGD, D-PSGD, AD-PSGD, SGP,
    eager-SGD; same seed, epochs and learning-rate schedule (warm-up for an
    epoch, then constant) for all.

``python -m experiments.campaign sweep``
    Throughput at 4, 8, 16, 32 ranks with emulated compute (no forward or
    backward: each step sleeps; full-size ResNet-20 buffers are communicated),
    the same 2 x 320 ms imbalance; what the paper's Figure 4 measures, scaled
    to fit on a workstation (see ``--compute-ms``).

Each writes its run files and ``table.md`` (the ``wagma.analysis`` table)
into ``--out-dir`` and prints the table.  Every run is a separate
``mpiexec`` job, launched with the ``mpiexec`` next to this Python (the
MPICH wheel's) unless ``MPIEXEC`` names another.
"""

import argparse
import os
import shutil
import subprocess
import sys
import time

__all__ = ["MAIN_ALGORITHMS", "find_mpiexec", "main"]

MAIN_ALGORITHMS = ("allreduce_sgd", "local_sgd", "wagma", "dpsgd", "adpsgd", "sgp", "eager_sgd")
PAPER_IMBALANCE = "random:k=2,ms=320"


def find_mpiexec():
    """``$MPIEXEC``, else the ``mpiexec`` next to this interpreter (the MPICH
    wheel's), else the one on PATH, else None."""
    return os.environ.get("MPIEXEC") or shutil.which("mpiexec", path=os.path.dirname(sys.executable)) \
        or shutil.which("mpiexec")


def _run(ranks, algo, out, extra):
    mpiexec = find_mpiexec()
    if not mpiexec:
        sys.exit("experiments.campaign: no mpiexec found; set MPIEXEC")
    command = [mpiexec, "-n", str(ranks), sys.executable, "-m", "experiments.train",
               "--algo", algo, "--out", out, *extra]
    print(f"\n$ {' '.join(command[0:3])} python -m experiments.train --algo {algo} {' '.join(extra)}",
          flush=True)
    start = time.monotonic()
    subprocess.run(command, check=True)
    print(f"{algo} on {ranks} ranks: {time.monotonic() - start:.0f} s", flush=True)


def _table(out_dir, files, extra=()):
    command = [sys.executable, "-m", "wagma.analysis", *files, "--baseline", "allreduce_sgd", *extra]
    table = subprocess.run([*command, "--markdown"], check=True, capture_output=True, text=True).stdout
    with open(os.path.join(out_dir, "table.md"), "w") as f:
        f.write(table)
    subprocess.run(command, check=True)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m experiments.campaign", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="campaign", required=True)
    m = sub.add_parser("main", help="8 ranks, digits, the paper's imbalance, every algorithm")
    m.add_argument("--ranks", type=int, default=8)
    m.add_argument("--epochs", type=int, default=20)
    m.add_argument("--decay-epochs", default="",
                   help="epochs of step decay of the learning rate (x0.1 at each; default none)")
    m.add_argument("--imbalance", default=PAPER_IMBALANCE)
    m.add_argument("--algos", default=",".join(MAIN_ALGORITHMS))
    m.add_argument("--out-dir", default=os.path.join("results", "main"))
    m.add_argument("--target-accuracy", type=float, default=0.95)
    s = sub.add_parser("sweep", help="emulated-compute throughput sweep over rank counts")
    s.add_argument("--ranks", default="4,8,16,32")
    s.add_argument("--steps", type=int, default=50)
    s.add_argument("--compute-ms", type=float, default=600.0,
                   help="compute time of a step before delays (the paper, balanced: 1.52 steps/s "
                        "for ResNet-50 at batch 128 per P100)")
    s.add_argument("--imbalance", default=PAPER_IMBALANCE)
    s.add_argument("--model", default="resnet20")
    s.add_argument("--algos", default=",".join(MAIN_ALGORITHMS))
    s.add_argument("--out-dir", default=os.path.join("results", "sweep"))
    args = parser.parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    files = []
    algos = [a for a in args.algos.split(",") if a]
    if args.campaign == "main":
        for algo in algos:
            out = os.path.join(args.out_dir, f"{algo}_p{args.ranks}.h5")
            _run(args.ranks, algo, out, ["--dataset", "digits", "--model", "mlp", "--epochs", str(args.epochs),
                                         "--decay-epochs", args.decay_epochs, "--imbalance", args.imbalance,
                                         "--no-progress"])
            files.append(out)
        _table(args.out_dir, files, ["--target-accuracy", str(args.target_accuracy)])
    else:
        for ranks in [int(r) for r in args.ranks.split(",")]:
            for algo in algos:
                out = os.path.join(args.out_dir, f"{algo}_p{ranks}.h5")
                _run(ranks, algo, out, ["--dataset", "synthetic", "--model", args.model, "--compute", "emulate",
                                        "--compute-ms", str(args.compute_ms), "--max-steps", str(args.steps),
                                        "--batch-size", "128", "--epochs", str(args.steps),
                                        "--imbalance", args.imbalance, "--no-progress"])
                files.append(out)
        _table(args.out_dir, files, ["--skip-steps", "5"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
