"""``python -m wagma.sim``: simulate algorithms at several rank counts, print
the comparison table, optionally write run files and the throughput figure."""

from __future__ import annotations

import argparse
import logging
import math
import os
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from collectives.logs import configure_logging
from wagma.analysis.plots import plot_throughput
from wagma.analysis.table import compare, format_table, render, run_label
from wagma.options import COMMAND_LINE, options_problem
from wagma.options.cli import add_algorithm_flags, options_from_args
from wagma.results import straggler_summary

from .engine import ALGORITHMS, Scenario, SimulatedRun, age_summary, save, simulate
from .network import COLLECTIVES, Network

if TYPE_CHECKING:
    from wagma.models import ModelName

__all__ = ["format_spread", "main", "model_parameters"]

logger = logging.getLogger("wagma.sim")


def model_parameters(name: ModelName) -> int:
    """The parameter count of ``wagma.models`` model ``name``, shaped for
    its synthetic data (ImageNet for resnet18/50, CIFAR for resnet20), built
    on PyTorch's meta device (no memory, no initialisation)."""
    import torch

    from wagma.datasets import load_dataset
    from wagma.models import build_model

    spec = load_dataset("synthetic", model=name, synthetic_size=1).spec
    with torch.device("meta"):
        return sum(p.numel() for p in build_model(name, spec).parameters())


def format_spread(runs: Iterable[SimulatedRun], skip: int = 0, markdown: bool = False) -> str:
    """Per run: how the waiting spreads over the ranks (each rank's mean wait
    per step: the least, median and most waiting rank), how old the
    averaged contributions were (mean and largest age in steps), and with
    ``sync="stragglar"`` the straggler predictor's record over the whole run
    (global synchronizations run with a prediction / all of them, and the
    fraction of those whose predicted rank did arrive last)."""
    cells = [
        ["algorithm", "P", "wait ms/step: least", "median", "most", "age: mean", "max", "sync", "predicted", "hit rate"]
    ]
    for run in sorted(runs, key=lambda r: (r.attrs["ranks"], r.attrs["algorithm"])):
        wait = np.nanmean(run.steps["wait_time"][:, skip:], axis=1) * 1e3
        assert run.age is not None  # simulate() always sets it
        mean_age, max_age = age_summary(run.age[:, skip:])
        predicted = hit_rate = "-"
        if "stragglers" in run.tables:
            record = straggler_summary(run.tables["stragglers"])
            predicted = f"{record['straggler_predictions']}/{record['straggler_syncs']}"
            hit_rate = f"{record['straggler_hit_rate']:.3f}" if record["straggler_predictions"] else "-"
        cells.append(
            [
                run_label(run),
                str(run.attrs["ranks"]),
                f"{wait.min():.1f}",
                f"{np.median(wait):.1f}",
                f"{wait.max():.1f}",
                f"{mean_age:.3f}",
                f"{max_age:.0f}",
                str(run.attrs["sync"]),
                predicted,
                hit_rate,
            ]
        )
    return render(cells, ["<"] + [">"] * 6 + ["<", ">", ">"], markdown)


def _int_list(text):
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return values


def build_parser():
    p = argparse.ArgumentParser(
        prog=".venv/bin/python -m wagma.sim",
        description="Simulate training algorithms at scale (alpha-beta communication, the training "
        "entry point's imbalance models) and compare their throughput.",
    )
    p.add_argument("--algo", default="all", help=f"comma-separated, or all: {', '.join(ALGORITHMS)}")
    p.add_argument("--ranks", type=_int_list, default=[16, 64, 256, 1024], help="comma-separated P [16,64,256,1024]")
    p.add_argument("--steps", type=int, default=1000, help="steps per rank [1000]")
    p.add_argument("--skip-steps", type=int, default=0, help="steps left out of the throughput [0]")
    p.add_argument(
        "--imbalance", default="random:k=2,ms=320", help="imbalance spec, as experiments.train [%(default)s]"
    )
    p.add_argument(
        "--compute-ms",
        type=float,
        default=600.0,
        help="compute of a step before injected delays [600: ResNet-50, batch 128, P100]",
    )
    p.add_argument(
        "--model", default="resnet50", help="model whose parameter count sizes the messages (wagma.models) [resnet50]"
    )
    p.add_argument("--parameters", type=int, default=None, help="parameter count instead of --model's")
    p.add_argument("--batch-size", type=int, default=128, help="per rank, for samples/s [128]")
    p.add_argument("--alpha-us", type=float, default=2.0, help="latency per message, microseconds [2: Cray Aries]")
    p.add_argument(
        "--beta-gbps", type=float, default=9.0, help="bandwidth per rank, GB/s (beta = 1 / it) [9: Cray Aries]"
    )
    p.add_argument(
        "--activation-us",
        type=float,
        default=None,
        help="time an activation of the wait-avoiding collectives takes per tree level, "
        "microseconds (the message and the receiving thread's polling) [the latency]",
    )
    p.add_argument(
        "--synchronization-ms",
        type=float,
        default=0.0,
        help="what a collective over all ranks costs beyond its messages once every rank is there: "
        "the ranks' arithmetic, updates and Python at once on shared cores "
        "(wagma.sim.Network.synchronization); the same at every --ranks [0: a core per rank]",
    )
    p.add_argument(
        "--collective",
        default="auto",
        choices=COLLECTIVES,
        help="schedule of blocking allreduces over all ranks [auto: the runtime's choice]",
    )
    p.add_argument("--seed", type=int, default=0, help="imbalance seed [0]")
    add_algorithm_flags(p)  # the flags of experiments.train, from the algorithms' options objects
    g = p.add_argument_group("straggler prediction (--sync stragglar; collectives.stragglar.prediction)")
    g.add_argument(
        "--predictor-decay",
        type=float,
        default=Scenario.decay,
        help="weight of the newest synchronization [%(default)s]",
    )
    g.add_argument(
        "--predictor-confidence",
        type=float,
        default=Scenario.confidence,
        help="frequency of being last from which a rank is predicted [%(default)s]",
    )
    g.add_argument(
        "--predictor-min-lead-ms",
        type=float,
        default=None,
        help="decayed lead (ms) the predicted rank must also have [the runtime's: the break-even "
        "share of the allreduce's time]",
    )
    g = p.add_argument_group("output")
    g.add_argument("--out-dir", default=None, help="write one run file per simulation: ALGO_pP.h5")
    g.add_argument("--plot", metavar="DIR", default=None, help="write DIR/throughput.png (throughput against P)")
    g.add_argument("--markdown", action="store_true", help="print a GitHub markdown table")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging()
    algos = list(ALGORITHMS) if args.algo == "all" else [a for a in args.algo.split(",") if a]
    unknown = [a for a in algos if a not in ALGORITHMS]
    if unknown or not algos:
        parser.error(f"--algo must be all or a comma-separated list of {', '.join(ALGORITHMS)}, got {args.algo!r}")
    if args.steps < 1 or not 0 <= args.skip_steps < args.steps:
        parser.error(f"--steps must be >= 1 and --skip-steps in [0, steps), got {args.steps} and {args.skip_steps}")
    if not (args.alpha_us >= 0 and args.beta_gbps > 0):
        parser.error(f"--alpha-us must be >= 0 and --beta-gbps > 0, got {args.alpha_us} and {args.beta_gbps}")
    if args.activation_us is not None and not args.activation_us >= 0:
        parser.error(f"--activation-us must be >= 0, got {args.activation_us}")
    if not (math.isfinite(args.synchronization_ms) and args.synchronization_ms >= 0):
        parser.error(f"--synchronization-ms must be a finite number >= 0, got {args.synchronization_ms}")
    try:
        network = Network(
            args.alpha_us * 1e-6,
            1 / (args.beta_gbps * 1e9),
            None if args.activation_us is None else args.activation_us * 1e-6,
            args.synchronization_ms * 1e-3,
        )
        parameters = args.parameters or model_parameters(args.model)
        plans = []
        for ranks in args.ranks:
            scenario = Scenario(
                ranks=ranks,
                steps=args.steps,
                network=network,
                parameters=parameters,
                imbalance=args.imbalance,
                compute_ms=args.compute_ms,
                collective=args.collective,
                seed=args.seed,
                model=args.model if args.parameters is None else "custom",
                batch_size=args.batch_size,
                decay=args.predictor_decay,
                confidence=args.predictor_confidence,
                min_lead_s=(None if args.predictor_min_lead_ms is None else args.predictor_min_lead_ms / 1e3),
            )
            for algo in algos:
                options = options_from_args(args, algo)
                problem = options_problem(algo, ranks, options, COMMAND_LINE)
                if problem:
                    parser.error(f"--algo {algo} on {ranks} ranks: {problem}")
                plans.append((algo, scenario, options))
        runs = []
        for algo, scenario, options in plans:
            start = time.perf_counter()
            run = simulate(algo, scenario, skip=args.skip_steps, **options)
            run.attrs["simulation_seconds"] = time.perf_counter() - start
            runs.append(run)
    except ValueError as exc:
        parser.error(str(exc))
    rows = compare(runs, skip=args.skip_steps)
    print(format_table(rows, markdown=args.markdown))
    print()
    print(format_spread(runs, args.skip_steps, markdown=args.markdown))
    slowest = max(runs, key=lambda r: r.attrs["simulation_seconds"])
    logger.info(
        "%d simulations of %d steps (%s parameters, alpha %g us, %g GB/s); slowest %s at P = %d: %.2f s",
        len(runs),
        args.steps,
        f"{parameters:,}",
        args.alpha_us,
        args.beta_gbps,
        slowest.attrs["algorithm"],
        slowest.attrs["ranks"],
        slowest.attrs["simulation_seconds"],
    )
    if args.out_dir:
        for run in runs:
            name = f"{run.attrs['algorithm']}_p{run.attrs['ranks']}.h5"
            logger.info("wrote %s", save(run, os.path.join(args.out_dir, name)))
    if args.plot:
        os.makedirs(args.plot, exist_ok=True)
        path = plot_throughput(rows, os.path.join(args.plot, "throughput.png"))
        if path:
            logger.info("wrote %s", path)
    return 0
