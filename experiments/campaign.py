"""The main job and the throughput sweep (docs/main-job.md): one ``mpiexec`` run per algorithm, then the table.

``.venv/bin/python -m experiments.campaign main``
    8 ranks train an MLP on scikit-learn's digits with the WAGMA paper's
    imbalance (2 random ranks delayed 320 ms at every step), once per
    algorithm as the paper ran its baselines: Allreduce-SGD, local SGD
    (period 1), WAGMA-SGD, D-PSGD, AD-PSGD, SGP with one and with two
    neighbours, eager-SGD, and ablation 1 (local SGD with period 10); same
    seed, epochs and learning-rate schedule (warm-up for an epoch, then
    constant) for all.

``.venv/bin/python -m experiments.campaign sweep``
    Throughput at 4, 8, 16, 32 ranks with emulated compute (no forward or
    backward: each step sleeps; full-size ResNet-20 buffers are communicated),
    the same 2 x 320 ms imbalance; what the paper's Figure 4 measures, scaled
    to fit on a workstation (see ``--compute-ms``).

``.venv-openmpi/bin/python -m experiments.campaign ensemblesync``
    EnsembleSync's Figures 4 and 5 in kind: 4 ranks train the MLP on
    digits (each step padded to ``--compute-ms``) with Sync SGD
    (allreduce_sgd), Async SGD (adpsgd) and ensemble_sync (with its
    reallocation), without a fault and with one on the last rank: stopped
    for ``--outage-s`` (longer than ``--timeout-s``) at 30 % of the run
    (epoch 3 of 10), slow (+``--slow-ms`` per step) over 20-60 %, killed at
    50 %.  The kill
    needs a launcher with fault tolerance (Open MPI's ULFM, hence the Open
    MPI venv); under MPICH those runs are skipped with the reason.  Writes
    ``table.md`` (what each fault cost), ``time_vs_epoch_<fault>.png`` and
    ``allocation.png``.

``.venv/bin/python -m experiments.campaign stragglersync``
    ``--sync stragglar`` against the allreduce in training: 8 ranks with
    emulated compute and ResNet-18's buffers (42.6 MiB of float32), under a
    persistent straggler (the last rank ``--delay-ms`` late at every step)
    and under random-k (2 random ranks as late, the WAGMA paper's shape),
    for allreduce_sgd, local_sgd with tau 1 and 10, and wagma.  Writes
    ``table.md``: throughput with each sync, the gain, and how often the
    predictor planned StragglAR and was right.

``.venv/bin/python -m experiments.campaign seeds``
    Each variant over several seeds and repeats (default: 2 ranks, digits,
    3 epochs, one random rank 20 ms late per step, seeds 11, 23, 37 twice
    each, four evaluations an epoch): ``table.md`` gives the range and mean
    of the final and of the last epoch's mean accuracy, and the stale
    fraction.  The default variants are eager-SGD's readings beside
    Allreduce-SGD (:data:`experiments.seeds.EAGER_READINGS`).

``.venv/bin/python -m experiments.campaign diloco``
    DiLoCo and Streaming DiLoCo (H 10), WAGMA-SGD with and without an
    outer optimizer (lr 0.7, Nesterov momentum 0.9), each with float32 and
    with int8 on the wire, on 8 ranks with the paper's imbalance: the
    accuracy task of ``experiments.reproduce`` over its seeds, and the main
    job; ``accuracy/table.md`` and ``main/table.md`` give each variant's
    accuracy, time to accuracy, throughput and the bytes each rank sent
    (:mod:`experiments.diloco_campaign`).

``.venv-openmpi/bin/python -m experiments.campaign survival``
    Every algorithm on 8 ranks with one rank killed at 40 % of the run, a
    non-zero rank and, separately, rank 0, under Open MPI's ULFM:
    ``table.md`` gives the time from the death to the survivors' next
    completed step and the final accuracy beside the failure-free run's
    (:mod:`experiments.survival`).

``.venv/bin/python -m experiments.campaign relaunch``
    Every algorithm that checkpoints on 8 ranks through ``slurm/train.sbatch``
    without fault tolerance, with one rank killed at 40 % of the run:
    ``train-job.sh`` relaunches on the ranks left from the last checkpoint;
    ``table.md`` gives the time lost per failure, the training redone and
    the relaunch, and the final accuracy beside the failure-free run's
    (:mod:`experiments.relaunch`; on ``SLURM_CONF``'s Slurm, or the one-node
    Slurm of ``scripts/local-slurm``).

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
import contextlib
import io
import math
import os
import subprocess
import sys
import time

from collectives.logs import configure_logging

from .chaos_campaign import ALGORITHMS as CHAOS_ALGORITHMS
from .chaos_campaign import long_steps, run_chaos, run_long, tabulate_chaos, tabulate_long
from .diloco_campaign import DILOCO_VARIANTS, run_diloco
from .jobs import clear_run, digits_mlp_args
from .jobs import run_training as _run
from .jobs import shown as _shown
from .mpirun import find_mpiexec
from .options import HelpFormatter
from .relaunch import ALGORITHMS as RELAUNCH_ALGORITHMS
from .relaunch import run_relaunch, tabulate_relaunch
from .seeds import EAGER_READINGS, run_seeds
from .slurm_jobs import SlurmUnavailable
from .survival import ALGORITHMS as SURVIVAL_ALGORITHMS
from .survival import run_survival, tabulate_survival

__all__ = ["MAIN_VARIANTS", "PAPER_IMBALANCE", "SWEEP_VARIANTS", "default_out_dir", "main", "parse_variants"]

#: The main job's runs, ``ALGO[:OPTION=VALUE...]`` (an option of experiments.train
#: without its dashes): the WAGMA paper's baselines as it ran them (section 5.1:
#: local SGD with period 1; SGP with one and two neighbours), and its ablation 1.
MAIN_VARIANTS = (
    "allreduce_sgd",
    "local_sgd",
    "wagma",
    "dpsgd",
    "adpsgd",
    "sgp:peers=1",
    "sgp:peers=2",
    "eager_sgd",
    "local_sgd:period=10",
)
#: Figure 4's algorithms (SGP with two neighbours there), and hierarchical SGD (levels
#: 2:sqrt(P), 10:P), which the simulator is validated on too.
SWEEP_VARIANTS = (
    "allreduce_sgd",
    "local_sgd",
    "wagma",
    "dpsgd",
    "adpsgd",
    "sgp:peers=2",
    "eager_sgd",
    "hierarchical_sgd",
)
#: The WAGMA paper's imbalance (section 5.2): two random ranks delayed 320 ms at every step.
PAPER_IMBALANCE = "random:k=2,ms=320"


def parse_variants(text, ranks):
    """``ALGO[:OPTION=VALUE|:SWITCH...]`` items, comma-separated, as ``(name,
    algo, flags)``: ``sgp:peers=2`` is ``("sgp_peers2", "sgp", ["--peers", "2"])``.
    Every item is checked as experiments.train would check it on each of
    ``ranks`` (a rank count or a list), so a bad one stops the campaign
    before any job starts.

    Raises:
        ValueError: the message names the item and the accepted values.
    """
    from wagma.algorithms import ALGORITHMS  # here: --help needs no torch

    from .options import build_parser, usage_problem

    variants = []
    for item in [i for i in text.split(",") if i]:
        algo, *options = item.split(":")
        if algo not in ALGORITHMS:
            raise ValueError(
                f"--algos: unknown algorithm {algo!r} in {item!r}; accepted: "
                f"{', '.join(sorted(ALGORITHMS))}, each optionally followed by :OPTION=VALUE"
            )
        flags = []
        for option in options:
            key, sep, value = option.partition("=")
            if not key:
                raise ValueError(
                    f"--algos: {item!r}: expected ALGO:OPTION=VALUE or ALGO:SWITCH "
                    f"(e.g. sgp:peers=2, wagma:fixed-groups)"
                )
            flags += [f"--{key.replace('_', '-')}", *([value] if sep else [])]
        for p in [ranks] if isinstance(ranks, int) else ranks:
            said = io.StringIO()
            try:
                with contextlib.redirect_stderr(said):
                    args, unknown = build_parser().parse_known_args(["--algo", algo, *flags])
            except SystemExit:
                raise ValueError(f"--algos: {item!r}: {said.getvalue().strip().splitlines()[-1]}") from None
            if unknown:
                raise ValueError(f"--algos: {item!r}: {' '.join(unknown)} is not an option of experiments.train")
            problem = usage_problem(args, p)
            if problem:
                raise ValueError(f"--algos: {item!r} on {p} ranks: {problem}")
        name = "_".join([algo, *(o.replace("=", "").replace("-", "_") for o in options)])
        variants.append((name, algo, flags))
    if not variants:
        raise ValueError("--algos: nothing given")
    return variants


def _seeds(text):
    """``"11,23,37"`` -> ``[11, 23, 37]``."""
    items = text.split(",")
    if not all(item.strip().isdigit() for item in items):
        raise argparse.ArgumentTypeError(f"expected comma-separated non-negative integers, got {text!r}")
    return [int(item) for item in items]


def default_out_dir(campaign, now=None):
    """``runs/CAMPAIGN-YYYYmmdd-HHMMSS``: a fresh, git-ignored folder per invocation."""
    return os.path.join("runs", f"{campaign}-{time.strftime('%Y%m%d-%H%M%S', time.localtime(now))}")


def _table(out_dir, files, extra=()):
    """``table.md`` and the figures of ``files`` in ``out_dir``; prints the table."""
    command = [sys.executable, "-m", "wagma.analysis", *files, "--baseline", "allreduce_sgd", *extra]
    table = subprocess.run([*command, "--markdown"], check=True, capture_output=True, text=True).stdout
    with open(os.path.join(out_dir, "table.md"), "w") as f:
        f.write(table)
    subprocess.run([*command, "--plot", out_dir], check=True)


def _parser():
    """The command line: one subcommand per campaign."""
    parser = argparse.ArgumentParser(
        prog=".venv/bin/python -m experiments.campaign", description=__doc__.splitlines()[0]
    )
    sub = parser.add_subparsers(dest="campaign", required=True)
    m = sub.add_parser(
        "main", help="8 ranks, digits, the paper's imbalance, every algorithm", formatter_class=HelpFormatter
    )
    m.add_argument("--ranks", type=int, default=8, help="ranks of every run")
    m.add_argument("--epochs", type=int, default=20, help="epochs of every run")
    m.add_argument("--decay-epochs", default="", help="epochs of step decay of the learning rate, x0.1 at each [none]")
    m.add_argument(
        "--imbalance",
        default=PAPER_IMBALANCE,
        help="experiments.train's --imbalance (the WAGMA paper's: 2 random ranks, 320 ms)",
    )
    m.add_argument(
        "--algos",
        default=",".join(MAIN_VARIANTS),
        help="comma-separated ALGO[:OPTION=VALUE...] (an experiments.train option without its dashes)",
    )
    m.add_argument(
        "--out-dir",
        default=None,
        help="run files, table.md and figures [a fresh runs/main-YYYYmmdd-HHMMSS]; "
        "results/main refreshes the committed reference results",
    )
    m.add_argument(
        "--target-accuracy",
        type=float,
        default=0.95,
        help="accuracy (a fraction) of the table's time-to-accuracy column",
    )
    s = sub.add_parser(
        "sweep", help="emulated-compute throughput sweep over rank counts", formatter_class=HelpFormatter
    )
    s.add_argument("--ranks", default="4,8,16,32", help="comma-separated rank counts")
    s.add_argument("--steps", type=int, default=50, help="steps of every run")
    s.add_argument(
        "--compute-ms",
        type=float,
        default=600.0,
        help="compute time of a step before delays (the paper, balanced: 1.52 steps/s "
        "for ResNet-50 at batch 128 per P100)",
    )
    s.add_argument("--imbalance", default=PAPER_IMBALANCE, help="experiments.train's --imbalance")
    s.add_argument("--model", default="resnet20", help="whose buffers are communicated")
    s.add_argument(
        "--algos",
        default=",".join(SWEEP_VARIANTS),
        help="comma-separated ALGO[:OPTION=VALUE...] (an experiments.train option without its dashes)",
    )
    s.add_argument(
        "--out-dir",
        default=None,
        help="run files, table.md and figures [a fresh runs/sweep-YYYYmmdd-HHMMSS]; "
        "results/sweep refreshes the committed reference results",
    )
    e = sub.add_parser(
        "ensemblesync",
        help="EnsembleSync's Figures 4 and 5: Sync SGD, Async SGD and ensemble_sync with a rank stopped, slow, killed",
        formatter_class=HelpFormatter,
    )
    e.add_argument("--ranks", type=int, default=4, help="ranks of every run (even: adpsgd)")
    e.add_argument("--epochs", type=int, default=10, help="epochs of every run")
    e.add_argument("--compute-ms", type=float, default=20.0, help="each step's compute, padded to this")
    e.add_argument("--period", type=int, default=5, help="ensemble_sync's T")
    e.add_argument("--timeout-s", type=float, default=1.0, help="ensemble_sync's timeout")
    e.add_argument("--outage-s", type=float, default=4.0, help="how long the stopped rank stays stopped")
    e.add_argument(
        "--slow-ms",
        type=float,
        default=60.0,
        help="what the slow rank adds to each step (the paper: 0.5 s per step over epochs 5-15)",
    )
    e.add_argument(
        "--out-dir",
        default=None,
        help="run files, table.md and figures [a fresh runs/ensemblesync-YYYYmmdd-HHMMSS]; "
        "results/ensemblesync refreshes the committed reference results",
    )
    e.add_argument("--algos", default="allreduce_sgd,adpsgd,ensemble_sync", help="comma-separated algorithms")
    d = sub.add_parser(
        "seeds",
        help="each variant over seeds and repeats: the spread of its accuracy "
        "(default: eager-SGD's readings beside Allreduce-SGD)",
        formatter_class=HelpFormatter,
    )
    d.add_argument("--ranks", type=int, default=2, help="ranks of every run")
    d.add_argument("--epochs", type=int, default=3, help="epochs of every run")
    d.add_argument("--dataset", default="digits", help="experiments.train's --dataset")
    d.add_argument("--model", default="mlp", help="experiments.train's --model")
    d.add_argument("--imbalance", default="random:k=1,ms=20", help="experiments.train's --imbalance")
    d.add_argument("--seeds", type=_seeds, default="11,23,37", help="comma-separated seeds")
    d.add_argument("--repeats", type=int, default=2, help="runs of each variant per seed")
    d.add_argument(
        "--eval-every",
        type=float,
        default=0.25,
        help="epochs between evaluations: the last epoch's mean averages several",
    )
    d.add_argument(
        "--algos",
        default=",".join(EAGER_READINGS),
        help="comma-separated ALGO[:OPTION=VALUE...] (an experiments.train option without its dashes)",
    )
    d.add_argument("--out-dir", default=None, help="run files and table.md [a fresh runs/seeds-YYYYmmdd-HHMMSS]")
    from .reproduce.accuracy_claims import ACCURACY_SEEDS  # which imports this module

    w = sub.add_parser(
        "diloco",
        help="DiLoCo, Streaming DiLoCo and WAGMA-SGD with and without an outer optimizer, each with and "
        "without int8, on the accuracy task over seeds and on the main job",
        formatter_class=HelpFormatter,
    )
    w.add_argument("--ranks", type=int, default=8, help="ranks of every run")
    w.add_argument("--epochs", type=int, default=20, help="epochs of the main job's runs")
    w.add_argument("--imbalance", default=PAPER_IMBALANCE, help="experiments.train's --imbalance")
    w.add_argument("--seeds", type=_seeds, default=",".join(map(str, ACCURACY_SEEDS)), help="the accuracy task's seeds")
    w.add_argument(
        "--accuracy-target", type=float, default=0.9, help="the accuracy task's time-to-accuracy target (a fraction)"
    )
    w.add_argument("--main-target", type=float, default=0.95, help="the main job's time-to-accuracy target")
    w.add_argument(
        "--tasks",
        type=lambda text: text.split(","),
        default="accuracy,main",
        help="comma-separated: accuracy (the accuracy task over --seeds), main (the main job)",
    )
    w.add_argument(
        "--tabulate", action="store_true", help="run nothing: the tables from the run files already in --out-dir"
    )
    w.add_argument(
        "--algos",
        default=",".join(DILOCO_VARIANTS),
        help="comma-separated ALGO[:OPTION=VALUE...] (an experiments.train option without its dashes)",
    )
    w.add_argument(
        "--out-dir",
        default=None,
        help="accuracy/ and main/ with their run files and table.md [a fresh runs/diloco-YYYYmmdd-HHMMSS]; "
        "results/diloco refreshes the committed results",
    )
    g = sub.add_parser(
        "stragglersync",
        help="--sync stragglar against the allreduce under a persistent straggler and under random-k",
        formatter_class=HelpFormatter,
    )
    g.add_argument("--ranks", type=int, default=8, help="ranks of every run")
    g.add_argument("--steps", type=int, default=80, help="steps of every run")
    g.add_argument(
        "--repeats", type=int, default=2, help="runs of each sync per algorithm and imbalance (the table averages them)"
    )
    g.add_argument("--compute-ms", type=float, default=50.0, help="each step's emulated compute")
    g.add_argument(
        "--delay-ms",
        type=float,
        default=100.0,
        help="the late rank's delay: about ring's allreduce time for ResNet-18's 42.6 MiB on "
        "8 ranks of 2 cores (82 ms at 32 MiB, 125 at 64: results/stragglar_sync)",
    )
    g.add_argument("--model", default="resnet18", help="whose buffers are communicated")
    g.add_argument("--imbalances", default="persistent,random-k", help="comma-separated: persistent, random-k")
    g.add_argument("--skip-steps", type=int, default=5, help="steps left out of the throughput")
    g.add_argument(
        "--algos",
        default="allreduce_sgd,local_sgd:1,local_sgd:10,wagma",
        help="comma-separated algorithms, ALGO:TAU for wagma's or local_sgd's period "
        "(local_sgd alone: tau 1, the WAGMA paper's baseline; wagma alone: its default 10)",
    )
    g.add_argument(
        "--out-dir",
        default=None,
        help="run files and table.md [a fresh runs/stragglersync-YYYYmmdd-HHMMSS]; "
        "results/stragglersync refreshes the committed reference results",
    )
    v = sub.add_parser(
        "survival",
        help="every algorithm with a rank killed mid-run (a non-zero rank, and rank 0) under ULFM",
        formatter_class=HelpFormatter,
    )
    v.add_argument("--ranks", type=int, default=8, help="ranks of every run")
    v.add_argument("--epochs", type=int, default=10, help="epochs of every run")
    v.add_argument("--compute-ms", type=float, default=20.0, help="each step's compute, padded to this")
    v.add_argument("--kill-at", type=float, default=0.4, help="when the victim dies, a fraction of the run")
    v.add_argument("--how", default="sigkill", help="how it dies: sigkill, sigsegv or exit")
    v.add_argument("--repeats", type=int, default=3, help="killed runs per algorithm and victim")
    v.add_argument("--seed", type=int, default=36, help="draws the non-zero victims")
    v.add_argument(
        "--algos",
        default=",".join(SURVIVAL_ALGORITHMS),
        help="comma-separated algorithms",
    )
    v.add_argument(
        "--tabulate",
        action="store_true",
        help="run nothing: table.md from the run files already in --out-dir",
    )
    v.add_argument(
        "--out-dir",
        default=None,
        help="run files and table.md [a fresh runs/survival-YYYYmmdd-HHMMSS]; "
        "results/survival refreshes the committed reference results",
    )
    c = sub.add_parser(
        "chaos",
        help="every algorithm under a stream of failures of every kind, without and with spares that replace "
        "the dead (ULFM); or one long run with --long-failures",
        formatter_class=HelpFormatter,
    )
    c.add_argument("--ranks", type=int, default=8, help="training ranks of every run (spares come on top)")
    c.add_argument("--steps", type=int, default=2400, help="steps of every run (about 3 minutes on 2 cores)")
    c.add_argument("--epochs", type=int, default=1000, help="epochs, a bound above --steps")
    c.add_argument("--compute-ms", type=float, default=20.0, help="each step's compute, padded to this")
    c.add_argument("--mtbf", type=float, default=20.0, help="mean seconds between failures")
    c.add_argument("--seed", type=int, default=23, help="the failures' seed")
    c.add_argument("--keep", type=int, default=2, help="no failure strikes while this many ranks or fewer are left")
    c.add_argument("--hang", type=float, default=5.0, help="seconds a stopped or hung rank is left before it is killed")
    c.add_argument("--spares", type=int, default=16, help="spare ranks of the runs with replacements")
    c.add_argument("--algos", default=",".join(CHAOS_ALGORITHMS), help="comma-separated algorithms")
    c.add_argument("--long-failures", type=int, default=0, help="run, instead, one long run with this many failures")
    c.add_argument("--long-algo", default="wagma", help="the long run's algorithm")
    c.add_argument("--long-mtbf", type=float, default=6.0, help="the long run's mean seconds between failures")
    c.add_argument(
        "--long-landing",
        type=float,
        default=0.75,
        help="the share of the long run's failures that strike a rank, for its steps (the others fall on a vacant row)",
    )
    c.add_argument(
        "--long-recovery-s",
        type=float,
        default=3.5,
        help="seconds each failure costs the long run, for its steps",
    )
    c.add_argument("--long-steps", type=int, default=0, help="the long run's steps [0: from the failure-free pace]")
    c.add_argument(
        "--long-seeds",
        default="0,1,2",
        help="seeds of the failure-free runs beside the long run: its own, then two others at least (the spread)",
    )
    c.add_argument(
        "--tabulate",
        action="store_true",
        help="run nothing: table.md and loss.png (with --long-failures: long.md and long.png) from the run files "
        "already in --out-dir",
    )
    c.add_argument(
        "--out-dir",
        default=None,
        help="run files, table.md and figures [a fresh runs/chaos-YYYYmmdd-HHMMSS]; "
        "results/chaos refreshes the committed reference results",
    )
    r = sub.add_parser(
        "relaunch",
        help="every algorithm that checkpoints with a rank killed mid-run without fault tolerance: "
        "slurm/train.sbatch relaunches on the ranks left",
        formatter_class=HelpFormatter,
    )
    r.add_argument("--ranks", type=int, default=8, help="ranks of every job")
    r.add_argument("--epochs", type=int, default=10, help="epochs of every run")
    r.add_argument("--compute-ms", type=float, default=20.0, help="each step's compute, padded to this")
    r.add_argument("--checkpoint-every", type=int, default=20, help="steps between checkpoints")
    r.add_argument("--kill-at", type=float, default=0.45, help="when the victim dies, a fraction of the run")
    r.add_argument("--repeats", type=int, default=3, help="killed jobs per algorithm (the first kills rank 0)")
    r.add_argument("--seed", type=int, default=36, help="draws the other repeats' victims")
    r.add_argument("--algos", default=",".join(RELAUNCH_ALGORITHMS), help="comma-separated algorithms")
    r.add_argument(
        "--tabulate",
        action="store_true",
        help="run nothing: table.md from the run files already in --out-dir",
    )
    r.add_argument(
        "--out-dir",
        default=None,
        help="run files, job logs and table.md [a fresh runs/relaunch-YYYYmmdd-HHMMSS]; "
        "results/relaunch refreshes the committed reference results",
    )
    return parser


def _main_job(args, mpiexec, out_dir, variants):
    """Every variant once on ``--ranks`` ranks, digits, the paper's imbalance; the table and figures."""
    files = []
    decay = ["--decay-epochs", args.decay_epochs] if args.decay_epochs else []
    for name, algo, flags in variants:
        out = os.path.join(out_dir, f"{name}_p{args.ranks}.h5")
        _run(
            mpiexec,
            args.ranks,
            algo,
            out,
            [
                "--dataset",
                "digits",
                "--model",
                "mlp",
                "--epochs",
                str(args.epochs),
                *decay,
                *flags,
                "--imbalance",
                args.imbalance,
            ],
        )
        files.append(out)
    _table(out_dir, files, ["--target-accuracy", str(args.target_accuracy)])


def _emulated_task(args):
    """experiments.train's flags for the sweep's and stragglersync's task:
    ``--model``'s buffers on synthetic data, ``--compute-ms`` of emulated
    compute per step, ``--steps`` steps of batch 128."""
    steps = str(args.steps)
    return [
        "--dataset",
        "synthetic",
        "--model",
        args.model,
        "--compute",
        "emulate",
        "--compute-ms",
        str(args.compute_ms),
        "--max-steps",
        steps,
        "--epochs",
        steps,
        "--batch-size",
        "128",
    ]


def _sweep(args, mpiexec, out_dir, variants):
    """Every variant at each rank count with emulated compute; the throughput table and plot."""
    files = []
    for ranks in [int(r) for r in args.ranks.split(",")]:
        for name, algo, flags in variants:
            out = os.path.join(out_dir, f"{name}_p{ranks}.h5")
            _run(
                mpiexec,
                ranks,
                algo,
                out,
                [*flags, *_emulated_task(args), "--imbalance", args.imbalance],
            )
            files.append(out)
    _table(out_dir, files, ["--skip-steps", "5"])


def main(argv=None):
    parser = _parser()
    args = parser.parse_args(argv)
    configure_logging()
    if args.campaign == "stragglersync":
        if set(args.imbalances.split(",")) - {"persistent", "random-k"}:
            parser.error(f"--imbalances: accepted persistent, random-k; got {args.imbalances!r}")
        args.variants, args.algos = (
            [a.partition(":") for a in args.algos.split(",") if a],
            ",".join(dict.fromkeys(a.partition(":")[0] for a in args.algos.split(",") if a)),
        )
    from wagma.algorithms import ALGORITHMS  # after parsing: --help needs no torch

    algos = [a for a in args.algos.split(",") if a]
    if args.campaign == "chaos":
        for flag, value in {"--steps": args.steps, "--ranks": args.ranks - 1, "--spares": args.spares}.items():
            if value < 1:
                parser.error(f"{flag} must be >= {2 if flag == '--ranks' else 1}, got {getattr(args, flag[2:])}")
        for flag, value in {"--mtbf": args.mtbf, "--hang": args.hang, "--long-mtbf": args.long_mtbf}.items():
            if not value > 0:
                parser.error(f"{flag} must be > 0 seconds, got {value}")
        if not 1 <= args.keep < args.ranks:
            parser.error(f"--keep must be from 1 to --ranks - 1 ({args.ranks - 1}), got {args.keep}")
        if args.long_failures < 0:
            parser.error(f"--long-failures must be >= 0, got {args.long_failures}")
        if args.long_failures:
            algos = [args.long_algo]  # checked below, as --algos is
            try:
                seeds = [int(s) for s in args.long_seeds.split(",")]
            except ValueError:
                seeds = []
            if len(set(seeds)) < 3:
                parser.error(
                    f"--long-seeds: three different seeds at least, comma-separated (the long run's, then a "
                    f"spread of two others); got {args.long_seeds!r}"
                )
            if args.long_recovery_s < 0:
                parser.error(f"--long-recovery-s must be >= 0 seconds, got {args.long_recovery_s}")
            if not 0 < args.long_landing <= 1:
                parser.error(f"--long-landing must be in (0, 1], got {args.long_landing}")
            if args.long_steps < 0:
                parser.error(f"--long-steps must be >= 0 (0: from the failure-free pace), got {args.long_steps}")
            try:
                long_steps(args.long_failures, args.long_mtbf, args.long_landing, args.long_recovery_s, 1.0)
            except ValueError as e:
                parser.error(str(e))
    if args.campaign == "diloco" and (not args.tasks or set(args.tasks) - {"accuracy", "main"}):
        parser.error(f"--tasks: comma-separated accuracy, main; got {','.join(args.tasks)!r}")
    if args.campaign in ("seeds", "survival", "relaunch") and args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    if args.campaign == "relaunch":
        if not 0 < args.kill_at < 1:
            parser.error(f"--kill-at must be a fraction of the run in (0, 1), got {args.kill_at}")
        if args.checkpoint_every < 1:
            parser.error(f"--checkpoint-every must be >= 1, got {args.checkpoint_every}")
        if args.ranks < 2:
            parser.error(f"--ranks must be >= 2 (one dies, the others go on), got {args.ranks}")
        uncheckpointed = [a for a in algos if a in ALGORITHMS and a not in RELAUNCH_ALGORITHMS]
        if uncheckpointed:
            parser.error(
                f"--algos: {', '.join(uncheckpointed)} takes no checkpoints, so it has nothing to relaunch "
                f"from; accepted: {', '.join(RELAUNCH_ALGORITHMS)}"
            )
    if args.campaign == "survival":
        from wagma.faults import DEATHS

        if args.how not in DEATHS:
            parser.error(f"--how: accepted {', '.join(DEATHS)}; got {args.how!r}")
        if not 0 < args.kill_at < 1:
            parser.error(f"--kill-at must be a fraction of the run in (0, 1), got {args.kill_at}")
    if args.campaign in ("main", "sweep", "seeds", "diloco"):
        try:
            variants = parse_variants(
                args.algos,
                args.ranks if args.campaign in ("main", "seeds", "diloco") else [int(r) for r in args.ranks.split(",")],
            )
        except ValueError as exc:
            parser.error(str(exc))
    else:
        unknown = sorted(set(algos) - set(ALGORITHMS))
        if unknown or not algos:
            parser.error(
                f"--algos: unknown {', '.join(unknown) or 'nothing given'}; accepted: {', '.join(sorted(ALGORITHMS))}"
            )
    mpiexec = find_mpiexec()
    if not mpiexec:
        parser.error("no mpiexec found next to this Python or on PATH; set MPIEXEC")
    if args.campaign in ("survival", "chaos") and kill_runs_refused(mpiexec):
        parser.error(f"the {args.campaign} campaign's failures: {kill_runs_refused(mpiexec)}")
    out_dir = args.out_dir or default_out_dir(args.campaign)
    os.makedirs(out_dir, exist_ok=True)
    if args.campaign == "main":
        _main_job(args, mpiexec, out_dir, variants)
    elif args.campaign == "ensemblesync":
        _ensemblesync(args, mpiexec, out_dir, algos)
    elif args.campaign == "stragglersync":
        _stragglersync(args, mpiexec, out_dir)
    elif args.campaign == "seeds":
        run_seeds(args, mpiexec, out_dir, variants)
    elif args.campaign == "diloco":
        run_diloco(args, mpiexec, out_dir, variants)
    elif args.campaign == "survival" and args.tabulate:
        tabulate_survival(out_dir, algos)
    elif args.campaign == "survival":
        run_survival(args, mpiexec, out_dir, algos)
    elif args.campaign == "chaos" and args.long_failures and args.tabulate:
        tabulate_long(out_dir)
    elif args.campaign == "chaos" and args.long_failures:
        run_long(args, mpiexec, out_dir)
    elif args.campaign == "chaos" and args.tabulate:
        tabulate_chaos(out_dir, algos)
    elif args.campaign == "chaos":
        run_chaos(args, mpiexec, out_dir, algos)
    elif args.campaign == "relaunch" and args.tabulate:
        tabulate_relaunch(out_dir, algos)
    elif args.campaign == "relaunch":
        try:
            run_relaunch(args, out_dir, algos)
        except SlurmUnavailable as exc:
            parser.error(f"the relaunch campaign needs Slurm (SLURM_CONF, or scripts/local-slurm): {exc}")
    else:
        _sweep(args, mpiexec, out_dir, variants)
    figures = (
        "" if args.campaign in ("stragglersync", "seeds", "survival", "relaunch", "diloco") else " and the figures"
    )
    if args.campaign == "chaos" and args.long_failures:
        print(f"\nwrote the run files, long.md and long.png to {_shown(out_dir)}", flush=True)
        return 0
    print(f"\nwrote the run files, table.md{figures} to {_shown(out_dir)}", flush=True)
    return 0


ENSEMBLE_ALGORITHMS = {
    "allreduce_sgd": "Sync SGD (allreduce_sgd)",
    "adpsgd": "Async SGD (adpsgd)",
    "ensemble_sync": "EnsembleSync (ensemble_sync --reallocate)",
}


def kill_runs_refused(mpiexec: str) -> str | None:
    """Why the ensemblesync campaign cannot kill a rank with ``mpiexec``, or
    None: a killed rank ends the job unless the launcher has fault tolerance
    (Open MPI's ULFM), so the kill runs are left out and the campaign says so."""
    from .mpirun import launcher_library

    library = launcher_library(mpiexec)
    if library == "openmpi":
        return None
    return (
        "they need a launcher with fault tolerance (Open MPI's ULFM; run this campaign with "
        f".venv-openmpi/bin/python), and {_shown(mpiexec)} is {library}'s"
    )


def _ensemblesync(args, mpiexec, out_dir, algos):
    """The faults on the last rank, at fractions of the run's steps."""
    from wagma.analysis.outages import format_outage_table, outage_row, plot_allocation, plot_time_vs_epoch
    from wagma.datasets import load_dataset
    from wagma.results import load_run, partial_path

    total = load_dataset("digits", rank=0, ranks=args.ranks).steps_per_epoch(16) * args.epochs
    victim = args.ranks - 1
    faults = {
        "none": [],  # at 30 %, over 20-60 % and at 50 % of the run: epochs 3, 2-5 and 5 of 10
        "stop": [f"stop:rank={victim},step={3 * total // 10},seconds={args.outage_s:g}"],
        "slow": [f"slow:rank={victim},steps={2 * total // 10}-{6 * total // 10 - 1},ms={args.slow_ms:g}"],
        "kill": [f"kill:rank={victim},step={total // 2}"],
    }
    refused = kill_runs_refused(mpiexec)
    common = digits_mlp_args(args.epochs, args.compute_ms)
    runs = {}
    for fault, specs in faults.items():
        if fault == "kill" and refused:
            print(f"\nskipped the kill runs: {refused}", flush=True)
            continue
        for algo in algos:
            extra = (
                ["--period", str(args.period), "--timeout-s", str(args.timeout_s), "--reallocate"]
                if algo == "ensemble_sync"
                else []
            )
            out = os.path.join(out_dir, f"{algo}_{fault}.h5")
            clear_run(out)
            _run(
                mpiexec,
                args.ranks,
                algo,
                out,
                [*common, *extra, *(w for s in specs for w in ("--fault", s))],
                fault_tolerant=fault == "kill",
                may_fail=fault == "kill" and algo != "ensemble_sync",
            )
            written = out if os.path.exists(out) else partial_path(out)
            runs[fault, algo] = load_run(written)
    rows = [outage_row(runs[fault, algo], fault, runs.get(("none", algo))) for fault, algo in runs]
    with open(os.path.join(out_dir, "table.md"), "w") as f:
        f.write(format_outage_table(rows))
    print("\n" + format_outage_table(rows), flush=True)
    for fault in faults:
        shown = {ENSEMBLE_ALGORITHMS.get(a, a): runs[fault, a] for a in algos if (fault, a) in runs}
        if fault != "none" and shown:
            plot_time_vs_epoch(
                shown,
                f"{args.ranks} ranks, rank {victim}: {faults[fault][0]}",
                os.path.join(out_dir, f"time_vs_epoch_{fault}.png"),
            )
    allocations = {
        f"ensemble_sync, {fault}": runs[fault, "ensemble_sync"]
        for fault in ("slow", "kill")
        if (fault, "ensemble_sync") in runs
    }
    if allocations:
        plot_allocation(
            allocations,
            "samples per step of each rank (Lemma 1's reallocation)",
            os.path.join(out_dir, "allocation.png"),
        )


def _stragglersync(args, mpiexec, out_dir):
    """Every algorithm variant with ``--sync allreduce`` and ``stragglar``,
    under a persistent straggler and under random-k; ``table.md``."""
    from wagma.results import load_run, summarize

    known = {
        "persistent": f"straggler:rank={args.ranks - 1},ms={args.delay_ms:g}",
        "random-k": f"random:k=2,ms={args.delay_ms:g}",
    }
    imbalances = {name: known[name] for name in args.imbalances.split(",")}
    common = [*_emulated_task(args), "--eval-every", "0"]
    rows = []
    for imbalance, spec in imbalances.items():
        for algo, _, tau in args.variants:
            tau = tau or ("1" if algo == "local_sgd" else "")
            label = f"{algo} (tau {tau})" if tau else algo
            runs = {"allreduce": [], "stragglar": []}
            # A then B, then B then A: a drift of the machine's load hits both alike.
            alternate = (("allreduce", "stragglar"), ("stragglar", "allreduce"))
            order = [s for r in range(args.repeats) for s in alternate[r % 2]]
            for r, sync in enumerate(order):
                out = os.path.join(
                    out_dir, f"{algo}{tau and '_tau' + tau}_{imbalance}_{sync}{'' if r < 2 else f'_{r // 2}'}.h5"
                )
                period = [{"local_sgd": "--period"}.get(algo, "--tau"), tau] if tau else []
                _run(mpiexec, args.ranks, algo, out, [*common, "--imbalance", spec, "--sync", sync, *period])
                runs[sync].append(summarize(load_run(out), skip=args.skip_steps))
            rows.append((imbalance, label, *(_mean_summary(runs[sync]) for sync in ("allreduce", "stragglar"))))
    table = _stragglersync_table(args, imbalances, rows)
    with open(os.path.join(out_dir, "table.md"), "w") as f:
        f.write(table)
    print("\n" + table, flush=True)


def _mean_summary(summaries):
    """The repeats' summaries averaged figure by figure; a figure some runs
    lack or have as NaN (the hit rate of a run without a prediction) is the
    mean of the others."""
    import numpy as np

    keys = dict.fromkeys(k for s in summaries for k in s)
    return {
        k: float(np.nanmean([s.get(k, math.nan) for s in summaries]))
        if any(math.isfinite(s.get(k, math.nan)) for s in summaries)
        else math.nan
        for k in keys
    }


def _stragglersync_table(args, imbalances, rows):
    lines = [
        f"{args.ranks} ranks, {os.cpu_count()} cores; emulated compute {args.compute_ms:g} ms per step, "
        f"{args.model}'s buffers, batch 128; {args.steps} steps, the first {args.skip_steps} left out; "
        f"each figure the mean of {args.repeats} runs; "
        + "; ".join(f"{k}: `{v}`" for k, v in imbalances.items())
        + ".",
        "",
        "| imbalance | algorithm | samples/s, allreduce | samples/s, stragglar | gain | "
        "syncs run as StragglAR | predictor's hit rate |",
        "|---|---|---|---|---|---|---|",
    ]
    for imbalance, label, base, ours in rows:
        gain = ours["throughput"] / base["throughput"] - 1
        hits = ours.get("straggler_hit_rate", math.nan)
        lines.append(
            f"| {imbalance} | {label} | {base['throughput']:.0f} | {ours['throughput']:.0f} | "
            f"{100 * gain:+.1f} % | {100 * ours.get('stragglar_fraction', 0):.0f} % | "
            f"{'-' if math.isnan(hits) else f'{100 * hits:.0f} %'} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
