"""The command line of ``python -m experiments.train``: parsing, and the checks made before any rank communicates."""

import argparse
import math
import os

from wagma.algorithms import ALGORITHMS
from wagma.imbalance import FORMS

__all__ = ["ALGORITHM_OPTIONS", "add_algorithm_options", "algorithm_options", "auto_group_size", "build_parser",
           "compute_ms", "default_out", "usage_problem"]

#: Which command-line option feeds which algorithm's keyword (``None`` default
#: = not given; giving it to an algorithm that has no such option is an error).
ALGORITHM_OPTIONS = {
    "bucket_cap_mb": ("allreduce_sgd",),
    "tau": ("wagma", "local_sgd"),
    "group_size": ("wagma",),
    "wait_avoiding": ("wagma",),
    "group_averaging": ("wagma",),
    "levels": ("hierarchical_sgd",),
    "levels_warmup_steps": ("hierarchical_sgd",),
    "peers": ("sgp",),
    "quorum": ("eager_sgd",),
}


def auto_group_size(ranks: int) -> int:
    """WAGMA-SGD's group size S = sqrt(P) (section 5.2), as a power of two.

    For odd log2 P, sqrt(P) lies between two powers of two; we round up
    (P = 8 -> 4, P = 32 -> 8): the paper's ablations lose accuracy with
    smaller groups (S = 4 at P = 64) and only throughput with larger ones.
    """
    return 1 << math.ceil(math.log2(ranks) / 2) if ranks > 1 else 1


def _levels(text):
    """``"2:4,10:P"`` -> [(2, "4"), (10, "P")]: period -> group size (P = all ranks)."""
    levels = []
    for item in text.split(","):
        period, sep, size = item.partition(":")
        if not sep or not period.strip().isdigit() or not (size.strip().isdigit() or size.strip() == "P"):
            raise argparse.ArgumentTypeError(
                f"expected PERIOD:SIZE[,PERIOD:SIZE...] with SIZE an integer or P, got {text!r}")
        levels.append((int(period), size.strip()))
    return levels


def _epochs(text):
    """``"30,60,80"`` -> [30.0, 60.0, 80.0]; ``""`` -> []."""
    try:
        return [float(e) for e in text.split(",") if e.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated numbers, got {text!r}") from None


def add_algorithm_options(parser):
    """The flags that feed the algorithms' options (:func:`algorithm_options`),
    shared by ``experiments.train`` and ``python -m wagma.sim``."""
    g = parser.add_argument_group("algorithm options (default: the paper's)")
    g.add_argument("--tau", type=int, default=None, help="wagma, local_sgd: global averaging period [10]")
    g.add_argument("--group-size", default=None, help="wagma: S, a power of two or 'auto' = sqrt(P) [auto]")
    g.add_argument("--no-wait-avoiding", dest="wait_avoiding", action="store_const", const=False,
                   default=None, help="wagma: alpha off")
    g.add_argument("--group-averaging", dest="group_averaging", action="store_const", const=True,
                   default=None, help="wagma: beta on (blocking group allreduce; needs --no-wait-avoiding)")
    g.add_argument("--levels", type=_levels, default=None,
                   help="hierarchical_sgd: PERIOD:SIZE,... groups of SIZE ranks average every PERIOD "
                        "steps, P = all [2:sqrt(P),10:P]")
    g.add_argument("--levels-warmup-steps", type=int, default=None,
                   help="hierarchical_sgd: steps of gradient allreduce first [0]")
    g.add_argument("--peers", type=int, default=None, help="sgp: out-peers per step [1]; training: 1 or 2, "
                   "the simulator: up to log2 P")
    g.add_argument("--quorum", default=None, help="eager_sgd: solo or majority [majority]")
    g.add_argument("--bucket-cap-mb", type=float, default=None, help="allreduce_sgd: bucket size [25]")


def build_parser(parser_class=argparse.ArgumentParser):
    p = parser_class(
        prog="mpiexec -n P python -m experiments.train",
        description="Train a model with one of the distributed SGD algorithms, with injected "
                    "load imbalance, writing one HDF5 run file (wagma.results).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--algo", required=True, choices=sorted(ALGORITHMS), help="the training algorithm")
    g = p.add_argument_group("model and data")
    g.add_argument("--model", default="mlp",
                   help="mlp, resnet20, resnet18, resnet50, transformer, transformer-base")
    g.add_argument("--dataset", default="digits", help="digits, cifar10, synthetic, translation")
    g.add_argument("--data-dir", default=None, help="cifar10: the cifar-10-batches-py folder")
    g.add_argument("--synthetic-size", type=int, default=None, help="synthetic: samples per rank")
    g.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="cuda: one GPU per rank, by local rank")
    g.add_argument("--threads", type=int, default=1, help="torch CPU threads per rank")
    g = p.add_argument_group("optimization (the paper's set-up)")
    g.add_argument("--epochs", type=int, default=20)
    g.add_argument("--max-steps", type=int, default=None, help="stop after this many steps per rank")
    g.add_argument("--batch-size", type=int, default=16, help="per rank")
    g.add_argument("--lr", type=float, default=0.05, help="peak learning rate")
    g.add_argument("--momentum", type=float, default=0.9)
    g.add_argument("--weight-decay", type=float, default=1e-4)
    g.add_argument("--warmup-epochs", type=float, default=1.0,
                   help="linear learning-rate warm-up from --warmup-start x lr")
    g.add_argument("--warmup-start", type=float, default=0.1)
    g.add_argument("--decay-epochs", type=_epochs, default="",
                   help="comma-separated epochs of step decay, e.g. 30,60,80")
    g.add_argument("--decay-factor", type=float, default=0.1)
    g.add_argument("--eval-every", type=int, default=1,
                   help="evaluate the averaged model every E epochs (and at the end); 0: only at the end")
    g.add_argument("--eval-replicas", action="store_true", help="also evaluate every rank's own model")
    g.add_argument("--seed", type=int, default=0, help="model init, data shards, imbalance draws")
    g = p.add_argument_group("imbalance and compute")
    g.add_argument("--imbalance", default="none", help="one of: " + "; ".join(FORMS))
    g.add_argument("--compute", default="real", choices=("real", "emulate"),
                   help="emulate: sleep instead of forward/backward, communicate full-size buffers")
    g.add_argument("--compute-ms", type=float, default=None,
                   help="the compute time of a step before injected delays: emulated steps sleep this "
                        "long [100]; real steps are padded up to it, to model a slower device [0: no padding]")
    add_algorithm_options(p)
    g = p.add_argument_group("output and restart")
    g.add_argument("--out", default=None,
                   help="run file [results/runs/ALGO_pP_MODEL_DATASET_sSEED.h5]")
    g.add_argument("--checkpoint-dir", default=None, help="per-rank checkpoints of model, optimizer, algorithm")
    g.add_argument("--checkpoint-every", type=int, default=0,
                   help="steps between checkpoints (0: only when stopped by a signal and at the end)")
    g.add_argument("--resume", action="store_true",
                   help="continue from the latest checkpoint in --checkpoint-dir, if there is one")
    g.add_argument("--stop-check-every", type=int, default=20,
                   help="steps between the ranks' agreement on a stop signal (SIGTERM, SIGUSR1)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar on rank 0")
    return p


def compute_ms(args) -> float:
    """``--compute-ms``, or its default: 100 ms when emulated, no padding when real."""
    if args.compute_ms is not None:
        return args.compute_ms
    return 100.0 if args.compute == "emulate" else 0.0


def default_out(args, ranks):
    return os.path.join("results", "runs",
                        f"{args.algo}_p{ranks}_{args.model}_{args.dataset}_s{args.seed}.h5")


def usage_problem(args, ranks):
    """The first problem with the parsed options, as a sentence, or None.

    Pure: every rank finds the same problem from the same command line.
    """
    positive = {"--epochs": args.epochs, "--batch-size": args.batch_size, "--threads": args.threads,
                "--stop-check-every": args.stop_check_every}
    for name, value in positive.items():
        if value < 1:
            return f"{name} must be >= 1, got {value}"
    for name, value in {"--max-steps": args.max_steps, "--synthetic-size": args.synthetic_size}.items():
        if value is not None and value < 1:
            return f"{name} must be >= 1, got {value}"
    for name, value in {"--eval-every": args.eval_every, "--checkpoint-every": args.checkpoint_every,
                        "--warmup-epochs": args.warmup_epochs, "--lr": args.lr,
                        "--weight-decay": args.weight_decay,
                        "--compute-ms": args.compute_ms or 0.0}.items():
        if value < 0:
            return f"{name} must be >= 0, got {value}"
    if not 0 <= args.momentum < 1:
        return f"--momentum must be in [0, 1), got {args.momentum}"
    decay = args.decay_epochs
    if decay != sorted(decay) or any(e <= 0 for e in decay):
        return f"--decay-epochs must be increasing and > 0, got {','.join(f'{e:g}' for e in decay)}"
    if args.resume and not args.checkpoint_dir:
        return "--resume needs --checkpoint-dir"
    if args.device == "cuda" and args.compute == "emulate":
        return "--compute emulate runs on --device cpu only"
    for option, algorithms in ALGORITHM_OPTIONS.items():
        if getattr(args, option) is not None and args.algo not in algorithms:
            flag = {"wait_avoiding": "--no-wait-avoiding"}.get(option, "--" + option.replace("_", "-"))
            return f"{flag} is an option of {' and '.join(algorithms)}, not of {args.algo}"
    if args.group_size not in (None, "auto") and not args.group_size.isdigit():
        return f"--group-size must be a power of two or 'auto', got {args.group_size!r}"
    if args.levels:
        for _, size in args.levels:
            if size != "P" and int(size) > ranks:
                return f"--levels group size {size} exceeds the {ranks} ranks"
    return None


def algorithm_options(args, ranks) -> dict:
    """The keyword options of ``wagma.algorithms.create`` for ``args.algo``."""
    s = auto_group_size(ranks) if args.group_size in (None, "auto") else int(args.group_size)
    tau = 10 if args.tau is None else args.tau
    if args.algo == "allreduce_sgd":
        return {"bucket_cap_mb": 25.0 if args.bucket_cap_mb is None else args.bucket_cap_mb}
    if args.algo == "local_sgd":
        return {"period": tau}
    if args.algo == "wagma":
        wait_avoiding = args.wait_avoiding if args.wait_avoiding is not None else not args.group_averaging
        return {"group_size": s, "tau": tau, "wait_avoiding": wait_avoiding,
                "group_averaging": bool(args.group_averaging)}
    if args.algo == "hierarchical_sgd":
        levels = args.levels or [(2, str(s)), (10, "P")]
        return {"period_group_size_dict": {period: ranks if size == "P" else int(size)
                                           for period, size in levels},
                "warmup_steps": args.levels_warmup_steps or 0}
    if args.algo == "sgp":
        return {"peers": 1 if args.peers is None else args.peers}
    if args.algo == "eager_sgd":
        return {"quorum": "majority" if args.quorum is None else args.quorum}
    return {}
