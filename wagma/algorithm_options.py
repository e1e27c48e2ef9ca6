"""The command-line flags of the algorithms' options, shared by ``experiments.train`` and ``wagma.sim``.

Importing this module imports no torch (``--help`` stays fast); the checks
that need the algorithm classes import them when called.
"""

import argparse
import math
import re

__all__ = ["ALGORITHM_NAMES", "ALGORITHM_OPTIONS", "KEYWORD_FLAGS", "SYNCS", "add_algorithm_options", "algorithm_options",
           "auto_group_size", "flags_problem", "in_flag_words"]

#: The names ``--algo`` accepts, the keys of :data:`wagma.algorithms.ALGORITHMS`
#: (kept here so that parsing a command line imports no torch; a test checks
#: that the two agree).
ALGORITHM_NAMES = ("adpsgd", "allreduce_sgd", "dpsgd", "eager_sgd", "ensemble_sync", "hierarchical_sgd", "local_sgd",
                   "sgp", "wagma")

#: Which command-line option feeds which algorithm's keyword (``None`` default
#: = not given; giving it to an algorithm that has no such option is an error).
ALGORITHM_OPTIONS = {
    "bucket_cap_mb": ("allreduce_sgd",),
    "tau": ("wagma", "local_sgd"),
    "group_size": ("wagma",),
    "wait_avoiding": ("wagma",),
    "group_averaging": ("wagma",),
    "fixed_groups": ("wagma",),
    "levels": ("hierarchical_sgd",),
    "levels_warmup_steps": ("hierarchical_sgd",),
    "peers": ("sgp",),
    "quorum": ("eager_sgd",),
    "period": ("ensemble_sync",),
    "timeout_s": ("ensemble_sync",),
    "reallocate": ("ensemble_sync", "local_sgd", "wagma"),
    "sync": ("allreduce_sgd", "local_sgd", "wagma"),
}

#: The values of ``--sync`` and of the algorithms' ``sync`` option: how the
#: global synchronizations reduce: ``"allreduce"`` (the tuned allreduce) or
#: ``"stragglar"`` (StragglAR with the rank predicted to arrive last,
#: :mod:`collectives.straggler_sync`).
SYNCS = ("allreduce", "stragglar")


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


def add_algorithm_options(parser):
    """The flags that feed the algorithms' options (:func:`algorithm_options`),
    shared by ``experiments.train`` and ``python -m wagma.sim``."""
    g = parser.add_argument_group("algorithm options (default: the paper's)")
    g.add_argument("--tau", type=int, default=None,
                   help="wagma: global averaging period [10]; local_sgd: averaging period [1, the WAGMA "
                        "paper's baseline (section 5.1); 10 is its ablation 1]")
    g.add_argument("--group-size", default=None, help="wagma: S, a power of two or 'auto' = sqrt(P) [auto]")
    g.add_argument("--no-wait-avoiding", dest="wait_avoiding", action="store_const", const=False,
                   default=None, help="wagma: alpha off")
    g.add_argument("--group-averaging", dest="group_averaging", action="store_const", const=True,
                   default=None, help="wagma: beta on (blocking group allreduce; needs --no-wait-avoiding)")
    g.add_argument("--fixed-groups", dest="fixed_groups", action="store_const", const=True, default=None,
                   help="wagma: average in iteration 0's groups at every step, not Algorithm 1's dynamic "
                        "butterfly groups (the paper's ablation 2, section 5.2)")
    g.add_argument("--levels", type=_levels, default=None,
                   help="hierarchical_sgd: PERIOD:SIZE,... groups of SIZE ranks average every PERIOD "
                        "steps, P = all [2:sqrt(P),10:P]")
    g.add_argument("--levels-warmup-steps", type=int, default=None,
                   help="hierarchical_sgd: steps of gradient allreduce first [0]")
    g.add_argument("--peers", type=int, default=None, help="sgp: out-peers per step [1]; training: 1 or 2, "
                   "the simulator: up to log2 P")
    g.add_argument("--quorum", default=None, help="eager_sgd: solo or majority [majority]")
    g.add_argument("--bucket-cap-mb", type=float, default=None, help="allreduce_sgd: bucket size [25]")
    g.add_argument("--period", type=int, default=None, help="ensemble_sync: T, local steps between syncs [10]")
    g.add_argument("--timeout-s", type=float, default=None,
                   help="ensemble_sync: seconds a sync waits for late ranks after the first one reports "
                        "[30, the paper's]")
    g.add_argument("--reallocate", action="store_const", const=True, default=None,
                   help="ensemble_sync, local_sgd, wagma: Lemma 1's shares of the global batch from the "
                        "ranks' measured speeds, at every global sync")
    g.add_argument("--sync", default=None,
                   help="allreduce_sgd, local_sgd, wagma: how the global synchronizations reduce: allreduce "
                        "(the tuned allreduce) or stragglar (StragglAR with the rank predicted to arrive last "
                        "as its straggler, the allreduce while no rank is predicted) [allreduce]")


def algorithm_options(args, ranks) -> dict:
    """The keyword options of ``wagma.algorithms.create`` for ``args.algo``."""
    s = auto_group_size(ranks) if args.group_size in (None, "auto") else int(args.group_size)
    reallocate = bool(args.reallocate)
    sync = "allreduce" if args.sync is None else args.sync
    if args.algo == "allreduce_sgd":
        return {"bucket_cap_mb": 25.0 if args.bucket_cap_mb is None else args.bucket_cap_mb, "sync": sync}
    if args.algo == "local_sgd":
        # Section 5.1: "Unless mentioned specifically, the synchronization
        # period of local SGD is set to one"; period 10 is ablation 1 of section 5.2.
        return {"period": 1 if args.tau is None else args.tau, "reallocate": reallocate, "sync": sync}
    if args.algo == "wagma":
        wait_avoiding = args.wait_avoiding if args.wait_avoiding is not None else not args.group_averaging
        return {"group_size": s, "tau": 10 if args.tau is None else args.tau, "wait_avoiding": wait_avoiding,
                "group_averaging": bool(args.group_averaging), "fixed_groups": bool(args.fixed_groups),
                "reallocate": reallocate, "sync": sync}
    if args.algo == "ensemble_sync":
        return {"period": 10 if args.period is None else args.period,
                "timeout_s": 30.0 if args.timeout_s is None else args.timeout_s, "reallocate": reallocate}
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


#: The flag that sets each keyword of the algorithms' constructors.
KEYWORD_FLAGS = {
    "bucket_cap_mb": "--bucket-cap-mb", "period": "--tau", "tau": "--tau", "group_size": "--group-size",
    "wait_avoiding": "--no-wait-avoiding", "group_averaging": "--group-averaging", "fixed_groups": "--fixed-groups",
    "period_group_size_dict": "--levels", "periods": "--levels periods", "warmup_steps": "--levels-warmup-steps",
    "peers": "--peers", "quorum": "--quorum", "timeout_s": "--timeout-s", "reallocate": "--reallocate",
    "sync": "--sync",
}
#: Where one keyword has another flag for one algorithm.
_ALGORITHM_KEYWORD_FLAGS = {"ensemble_sync": {"period": "--period"}}
_KEYWORD = re.compile(r"\b(" + "|".join(sorted(KEYWORD_FLAGS, key=len, reverse=True)) + r")\b")
_WORLD_SIZE = re.compile(r"\b(?:the )?world[_ ]size\b")
_RANK_COUNT = re.compile(r"\bnumber of ranks\b")


def in_flag_words(problem: str, algorithm: str = None) -> str:
    """An algorithm's problem sentence in the words of the command line: its
    keywords become the flags that set them (``group_size`` -> ``--group-size``)
    and the world size becomes the launcher's ``-n``."""
    flags = {**KEYWORD_FLAGS, **_ALGORITHM_KEYWORD_FLAGS.get(algorithm, {})}
    problem = _KEYWORD.sub(lambda m: flags[m.group(1)], problem)
    problem = _RANK_COUNT.sub("number of ranks (mpiexec -n)", problem)
    return _WORLD_SIZE.sub("the number of ranks (mpiexec -n)", problem)


def flags_problem(args, ranks):
    """The first problem with the algorithm flags of ``args`` on ``ranks``
    ranks, in the command line's words, or None.

    Pure (no model, no MPI; imports the algorithm classes): the same verdict
    on every rank, before anything is built.  Covers flags given to an
    algorithm that has no such option, the flags' own formats, and the
    algorithm's :meth:`~wagma.algorithms.Algorithm.check_options` on the
    options :func:`algorithm_options` makes of them (rank counts the
    algorithm cannot run on included).
    """
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
    from wagma.algorithms import options_problem

    problem = options_problem(args.algo, ranks, **algorithm_options(args, ranks))
    return None if problem is None else f"--algo {args.algo}: {in_flag_words(problem, args.algo)}"
