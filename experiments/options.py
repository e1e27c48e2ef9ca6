"""The command line of ``python -m experiments.train``: parsing, and the checks made before any rank communicates."""

import argparse
import os
import re

from wagma.chaos import CHAOS_FORM
from wagma.faults import FAULT_FORMS
from wagma.imbalance import FORMS
from wagma.options import ALGORITHM_NAMES
from wagma.options.cli import add_algorithm_flags, flags_problem

__all__ = ["HelpFormatter", "UsageError", "build_parser", "compute_ms", "default_out", "usage_problem"]


class UsageError(Exception):
    """A bad command line or set-up, found on every rank before training."""


def _epochs(text):
    """``"30,60,80"`` -> [30.0, 60.0, 80.0]; ``""`` -> []."""
    try:
        return [float(e) for e in text.split(",") if e.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated numbers, got {text!r}") from None


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Shows ``(default: X)`` after a help text, unless the option has no
    default (None, False, empty) or its text ends with the default in
    ``[...]``; the description and the example are printed as written, so
    that the example stays on one line and can be pasted."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if default is None or default is False or default in ("", argparse.SUPPRESS) or re.search(r"\[[^\]]*\]$", text):
            return text
        return f"{text} (default: %(default)s)" if text else "default: %(default)s"


def build_parser(parser_class=argparse.ArgumentParser):
    p = parser_class(
        prog=".venv/bin/mpiexec -n 8 .venv/bin/python -m experiments.train",
        description="Train a model with one of the distributed SGD algorithms, with injected\n"
        "load imbalance, writing one HDF5 run file (wagma.results).  Any launcher and\n"
        "rank count work (mpiexec -n P, srun); the usage line runs 8 ranks with the\n"
        "project's virtual environment, from the repository's root.",
        epilog="example (4 ranks, 2 epochs of WAGMA-SGD on digits, one rank delayed 50 ms a step):\n"
        "  .venv/bin/mpiexec -n 4 .venv/bin/python -m experiments.train --algo wagma --epochs 2 "
        "--imbalance random:k=1,ms=50",
        formatter_class=HelpFormatter,
    )
    p.add_argument("--algo", required=True, choices=ALGORITHM_NAMES, help="the training algorithm")
    g = p.add_argument_group("model and data")
    g.add_argument("--model", default="mlp", help="mlp, resnet20, resnet18, resnet50, transformer, transformer-base")
    g.add_argument("--dataset", default="digits", help="digits, cifar10, synthetic, synthetic-cifar, translation")
    g.add_argument("--data-dir", default=None, help="cifar10: the cifar-10-batches-py folder")
    g.add_argument("--synthetic-size", type=int, default=None, help="synthetic: samples per rank")
    g.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="cuda: one GPU per rank, by local rank")
    g.add_argument("--threads", type=int, default=1, help="torch CPU threads per rank")
    g = p.add_argument_group("optimization (the paper's set-up)")
    g.add_argument("--epochs", type=int, default=20, help="passes over each rank's shard")
    g.add_argument("--max-steps", type=int, default=None, help="stop after this many steps per rank")
    g.add_argument("--batch-size", type=int, default=16, help="per rank")
    g.add_argument("--lr", type=float, default=0.05, help="peak learning rate")
    g.add_argument("--momentum", type=float, default=0.9, help="SGD momentum, 0 <= m < 1")
    g.add_argument("--weight-decay", type=float, default=1e-4, help="L2 penalty of the local SGD update")
    g.add_argument(
        "--warmup-epochs", type=float, default=1.0, help="linear learning-rate warm-up from --warmup-start x lr"
    )
    g.add_argument(
        "--warmup-start", type=float, default=0.1, help="the warm-up's first learning rate, as a fraction of --lr"
    )
    g.add_argument(
        "--decay-epochs", type=_epochs, default="", help="comma-separated epochs of step decay, e.g. 30,60,80 [none]"
    )
    g.add_argument(
        "--decay-factor",
        type=float,
        default=0.1,
        help="the learning rate is multiplied by this at each of --decay-epochs",
    )
    g.add_argument(
        "--eval-every",
        type=float,
        default=1.0,
        help="evaluate the averaged model every E epochs, a fraction for several evaluations an "
        "epoch (0.25: four), and at the end; 0: only at the end",
    )
    g.add_argument("--eval-replicas", action="store_true", help="also evaluate every rank's own model")
    g.add_argument("--seed", type=int, default=0, help="model init, data shards, imbalance draws")
    g = p.add_argument_group("imbalance and compute")
    g.add_argument("--imbalance", default="none", help="one of: " + "; ".join(FORMS))
    g.add_argument(
        "--fault",
        action="append",
        default=None,
        metavar="SPEC",
        help="inject a fault (repeatable), one of: "
        + "; ".join(FAULT_FORMS)
        + " (steps from 0; stop: SIGSTOP, then SIGCONT after SEC; kill: SIGKILL)",
    )
    g.add_argument(
        "--compute",
        default="real",
        choices=("real", "emulate"),
        help="emulate: sleep instead of forward/backward, communicate full-size buffers",
    )
    g.add_argument(
        "--compute-ms",
        type=float,
        default=None,
        help="the compute time of a step before injected delays: emulated steps sleep this "
        "long [100]; real steps are padded up to it, to model a slower device [0: no padding]",
    )
    g = p.add_argument_group(
        "healing (under MPI fault tolerance: python -m experiments.mpirun --fault-tolerant; docs/healing.md)"
    )
    g.add_argument(
        "--replace",
        type=int,
        default=0,
        metavar="N",
        help="start a replacement for each rank that dies, at most N over the run: it joins at the survivors' "
        "next step with a living rank's state (wagma.healing)",
    )
    g.add_argument(
        "--spares",
        type=int,
        default=0,
        metavar="K",
        help="the job's last K ranks wait, idle, and each replaces a rank that dies (up to K, or --replace N if "
        "fewer), as often as there are spares (collectives.spares); without it replacements are spawned",
    )
    g.add_argument(
        "--chaos",
        default=None,
        metavar="SPEC",
        help=f"failures at random times, seeded (wagma.chaos): {CHAOS_FORM}",
    )
    g.add_argument(
        "--replace-wait",
        type=float,
        default=60.0,
        metavar="SEC",
        help="the most seconds the survivors wait for a replacement to prove the job's secret; then they go on "
        "without it",
    )
    add_algorithm_flags(p)
    g = p.add_argument_group("output and restart")
    g.add_argument("--out", default=None, help="run file [runs/ALGO_pP_MODEL_DATASET_sSEED.h5]")
    g.add_argument("--checkpoint-dir", default=None, help="per-rank checkpoints of model, optimizer, algorithm")
    g.add_argument(
        "--checkpoint-every",
        type=int,
        default=0,
        help="steps between checkpoints (0: only when stopped by a signal and at the end)",
    )
    g.add_argument(
        "--resume", action="store_true", help="continue from the latest checkpoint in --checkpoint-dir, if there is one"
    )
    g.add_argument(
        "--stop-check-every",
        type=int,
        default=20,
        help="steps between the ranks' agreement on a stop signal (SIGTERM, SIGUSR1)",
    )
    g.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress report on rank 0 (a bar on a terminal, else a log line per tenth of the run)",
    )
    return p


def compute_ms(args) -> float:
    """``--compute-ms``, or its default: 100 ms when emulated, no padding when real."""
    if args.compute_ms is not None:
        return args.compute_ms
    return 100.0 if args.compute == "emulate" else 0.0


def default_out(args, ranks):
    return os.path.join("runs", f"{args.algo}_p{ranks}_{args.model}_{args.dataset}_s{args.seed}.h5")


def _replace_problem(args):
    """Why ``--replace`` or ``--spares`` cannot work in this job, or None:
    replacements join through MPI fault tolerance, spawned ones with the
    secret the launcher gave the job."""
    from collectives.admission import SECRET_VARIABLE, job_secret
    from collectives.failures import fault_tolerant

    flag = f"--replace {args.replace}" if args.replace else f"--spares {args.spares}"
    if not fault_tolerant():
        return (
            f"{flag}: replacements join through MPI fault tolerance; start the job with "
            f"python -m experiments.mpirun --fault-tolerant (Open MPI's ULFM)"
        )
    if not job_secret() and not args.spares:  # spares are the job's own ranks: no secret to prove
        return (
            f"--replace {args.replace}: the job has no secret for replacements to prove (${SECRET_VARIABLE}); "
            f"python -m experiments.mpirun --fault-tolerant gives it one"
        )
    return None


def usage_problem(args, ranks):
    """The first problem with the parsed options, as a sentence, or None.

    Pure: every rank finds the same problem from the same command line.
    """
    positive = {
        "--epochs": args.epochs,
        "--batch-size": args.batch_size,
        "--threads": args.threads,
        "--stop-check-every": args.stop_check_every,
    }
    for name, value in positive.items():
        if value < 1:
            return f"{name} must be >= 1, got {value}"
    for name, value in {"--max-steps": args.max_steps, "--synthetic-size": args.synthetic_size}.items():
        if value is not None and value < 1:
            return f"{name} must be >= 1, got {value}"
    for name, value in {
        "--eval-every": args.eval_every,
        "--checkpoint-every": args.checkpoint_every,
        "--warmup-epochs": args.warmup_epochs,
        "--lr": args.lr,
        "--weight-decay": args.weight_decay,
        "--compute-ms": args.compute_ms or 0.0,
    }.items():
        if value < 0:
            return f"{name} must be >= 0, got {value}"
    if args.replace < 0:
        return f"--replace must be >= 0, got {args.replace}"
    if args.spares < 0:
        return f"--spares must be >= 0, got {args.spares}"
    if not args.replace_wait > 0:
        return f"--replace-wait must be > 0 seconds, got {args.replace_wait}"
    if args.spares and args.replace > args.spares:
        return f"--replace {args.replace} is more than the --spares {args.spares} that replace dead ranks"
    if args.replace or args.spares:
        problem = _replace_problem(args)
        if problem:
            return problem
    if not 0 <= args.momentum < 1:
        return f"--momentum must be in [0, 1), got {args.momentum}"
    decay = args.decay_epochs
    if decay != sorted(decay) or any(e <= 0 for e in decay):
        return f"--decay-epochs must be increasing and > 0, got {','.join(f'{e:g}' for e in decay)}"
    if args.resume and not args.checkpoint_dir:
        return "--resume needs --checkpoint-dir"
    if args.device == "cuda" and args.compute == "emulate":
        return "--compute emulate runs on --device cpu only"
    if args.algo == "ensemble_sync":
        # Its ranks are not in step (a late rank skips forward, a dead one is
        # gone), so nothing may wait for all of them at the same step.
        for flag, value in {"--checkpoint-dir": args.checkpoint_dir, "--eval-replicas": args.eval_replicas}.items():
            if value:
                return (
                    f"{flag} is not available with --algo ensemble_sync: it needs every rank at the same "
                    f"step, and ensemble_sync's ranks may be late or dead"
                )
    return flags_problem(args, ranks)
