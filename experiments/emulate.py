"""``python -m experiments.emulate``: the training of ``experiments.train`` on P emulated ranks in one process.

Two sources of the order of contributions (:mod:`wagma.emulate`):

* the simulator (default): ``--ranks P`` ranks with a core or GPU each, the
  step time ``--compute-ms`` plus ``--imbalance``'s delays, the network
  ``--alpha-us`` and ``--beta-gbps``: Figure 5 at the paper's scale;
* a measured run (``--replay RUN.h5``): the run's own command line and the
  contributions it logged, to reproduce its models; with ``--checkpoints
  DIR`` (the run's ``--checkpoint-dir``) each replica is compared with the
  rank's model saved at the end.

The task is built as ``experiments.train`` builds it for every rank: the
same dataset shards, initial model, SGD, learning-rate schedule and
batches; each replica keeps its own torch random state.  Writes one run
file (``kind`` ``"emulated"``; times from the schedule, losses and
evaluations from the emulation) and prints the final accuracy.
docs/emulation.md explains the set-up.

Exit status: 0, 1 when ``--checkpoints`` finds a replica that differs
beyond the stated bound, 2 for a bad command line.
"""

import argparse
import json
import logging
import math
import os
import sys

import numpy as np

from collectives.logs import configure_logging

from .options import build_parser, compute_ms, usage_problem

__all__ = ["main"]

logger = logging.getLogger(__name__)

EXIT_DIFFERS, EXIT_USAGE = 1, 2


def _parser():
    p = build_parser()
    p.prog = ".venv/bin/python -m experiments.emulate"
    p.description = (
        "Emulate experiments.train on P ranks in one process: each rank's replica trained as the "
        "run would train it, the order of the contributions from the simulator (a core or GPU per "
        "rank) or from a measured run's file (--replay)."
    )
    p.epilog = (
        "example (WAGMA-SGD on 4 emulated ranks, one of them 320 ms late at every step; seconds):\n"
        "  .venv/bin/python -m experiments.emulate --ranks 4 --algo wagma --epochs 1 "
        "--imbalance random:k=1,ms=320 --no-progress --out runs/wagma_p4_emulated.h5"
    )
    for action in p._actions:
        if action.dest == "algo":
            action.required = False
        if action.dest == "compute_ms":
            action.help = "the step time of every rank before injected delays, simulated [600: the paper's]"
    p.set_defaults(compute_ms=600.0)
    g = p.add_argument_group("emulation")
    g.add_argument("--ranks", type=int, default=8, help="P, the emulated ranks [8]")
    g.add_argument("--alpha-us", type=float, default=2.0, help="the simulated network's latency [2: Cray Aries]")
    g.add_argument("--beta-gbps", type=float, default=9.0, help="its bandwidth per rank, GB/s [9]")
    g.add_argument(
        "--replay",
        metavar="RUN",
        default=None,
        help="a measured run file: its command line and its logged contributions (the other flags "
        "but --out and --checkpoints are ignored)",
    )
    g.add_argument(
        "--checkpoints",
        metavar="DIR",
        default=None,
        help="with --replay: the run's --checkpoint-dir, whose final models the replicas must equal",
    )
    return p


def _problem(args):
    if args.replay is not None:
        if not os.path.exists(args.replay):
            return f"--replay {args.replay}: no such file"
        return None
    if args.checkpoints is not None:
        return "--checkpoints goes with --replay"
    if args.algo is None:
        return "--algo is required (or --replay)"
    if args.ranks < 1:
        return f"--ranks must be >= 1, got {args.ranks}"
    if args.compute == "emulate":
        return "--compute emulate has no gradients to emulate; leave --compute real"
    for flag in ("fault", "checkpoint_dir", "resume"):
        if getattr(args, flag):
            return f"--{flag.replace('_', '-')} is not emulated"
    problem = usage_problem(args, args.ranks)
    if problem is None and not compute_ms(args) > 0:
        problem = f"--compute-ms must be > 0 (a step takes time), got {args.compute_ms:g}"
    return problem


def _replayed_args(args):
    """The command line of the run ``--replay`` names, and its schedule."""
    from wagma.emulate import logged_schedule
    from wagma.results import load_run

    run = load_run(args.replay)
    if run.attrs.get("kind") != "measured":
        raise ValueError(f"--replay {args.replay}: not a measured run (kind {run.attrs.get('kind')!r})")
    config = json.loads(run.attrs["config"])
    config.pop("algorithm_options", None)
    if "algo" not in config:
        raise ValueError(
            f"--replay {args.replay}: not a run of experiments.train, whose task this command "
            f"rebuilds (a loop of one's own replays with wagma.emulate.logged_schedule)"
        )
    for key, why in (("fault", "faults injected"), ("resume", "resumed from a checkpoint")):
        if config.get(key):
            raise ValueError(f"--replay {args.replay}: a run with {why} is not replayed")
    if config.get("compute") != "real":
        raise ValueError(
            f"--replay {args.replay}: a run of --compute {config.get('compute')} has no gradients to replay"
        )
    replayed = argparse.Namespace(
        **{
            **vars(args),
            **config,
            "replay": args.replay,
            "out": args.out,
            "checkpoints": args.checkpoints,
            "ranks": int(run.attrs["ranks"]),
        }
    )
    return replayed, logged_schedule(run), run


def _simulated(args, parameters):
    from wagma.emulate import simulated_schedule
    from wagma.options.cli import options_from_args
    from wagma.sim import Network, Scenario

    scenario = Scenario(
        ranks=args.ranks,
        steps=args.total,
        parameters=parameters,
        imbalance=args.imbalance,
        network=Network(alpha=args.alpha_us * 1e-6, beta=1 / (args.beta_gbps * 1e9)),
        compute_ms=compute_ms(args),
        seed=args.seed,
        model=args.model,
        batch_size=args.batch_size,
    )
    return simulated_schedule(args.algo, scenario, **options_from_args(args, args.algo))


class _Task:
    """Every rank's part of ``experiments.train``'s task: shards, replicas, batches."""

    def __init__(self, args, ranks):
        import torch

        from wagma.models import build_model

        from .build import dataset_of, optimizer_of

        self.args = args
        self.datasets = [dataset_of(args, r, ranks) for r in range(ranks)]
        self.spec = self.datasets[0].spec
        torch.manual_seed(args.seed)
        model = build_model(args.model, self.spec)
        state = torch.get_rng_state()  # each rank's, after the same seed and the same model
        self.models = [model] + [_copy(model) for _ in range(ranks - 1)]
        self.rng = [state.clone() for _ in range(ranks)]
        self.optimizers = [optimizer_of(args, m) for m in self.models]
        self.steps_per_epoch = self.datasets[0].steps_per_epoch(args.batch_size)
        self._batches = [None] * ranks

    def gradient(self, r, t):
        """Rank r's forward and backward of step t, with its own random state."""
        import torch

        from .tasks import loss_and_correct

        epoch, index = divmod(t, self.steps_per_epoch)
        if index == 0 or self._batches[r] is None:
            self._batches[r] = self.datasets[r].train_batches(epoch, self.args.batch_size, start=index)
        batch = next(self._batches[r])
        outside = torch.get_rng_state()
        torch.set_rng_state(self.rng[r])
        loss, _, _ = loss_and_correct(self.models[r], batch, self.spec)
        loss.backward()
        self.rng[r] = torch.get_rng_state()
        torch.set_rng_state(outside)
        return loss.item()


def _copy(model):
    import copy

    return copy.deepcopy(model)


def _emulate(args, schedule, task):
    """Run the emulator; returns ``(loss[P, T], evals)``."""
    from wagma.emulate import Emulator
    from wagma.evaluation import averaged_replicas

    from .evaluate import score
    from .schedule import LearningRate

    lr = LearningRate(
        args.lr, task.steps_per_epoch, args.warmup_epochs, args.warmup_start, args.decay_epochs, args.decay_factor
    )
    emulator = Emulator(schedule, task.models, task.optimizers)
    interval = max(1, round(args.eval_every * task.steps_per_epoch)) if args.eval_every else 0
    evals = {k: [] for k in ("step", "epoch", "clock", "accuracy", "loss")}
    average = None

    def evaluate(t):
        nonlocal average
        step = t + 1
        if not (step == schedule.steps or (interval and step % interval == 0)):
            return
        average = averaged_replicas(task.models, into=average)
        loss_sum, correct, count = score(average, task.datasets[0], max(args.batch_size, 256))
        for key, value in (
            ("step", step),
            ("epoch", step / task.steps_per_epoch),
            ("clock", float(np.max(schedule.clock[:, t]))),
            ("accuracy", correct / max(count, 1)),
            ("loss", loss_sum / max(count, 1)),
        ):
            evals[key].append(value)
        if not args.no_progress:
            logger.info(
                "step %d epoch %g: averaged model accuracy %.2f %%",
                step,
                step / task.steps_per_epoch,
                100 * evals["accuracy"][-1],
            )

    loss = emulator.run(task.gradient, lr=lr, after_step=evaluate)
    return emulator, loss, {k: np.array(v) for k, v in evals.items()}


def _steps(schedule, measured, loss):
    """The run file's step fields: times from the simulated or measured run, losses from the emulation."""
    source = measured.steps if measured is not None else schedule.run.steps
    steps = {k: np.asarray(v, dtype=np.float64) for k, v in source.items()}
    steps["loss"], steps["stale"] = loss, schedule.stale
    contribution = schedule.arrays.get("source")
    steps["contribution"] = contribution.astype(np.float64) if contribution is not None else np.full_like(loss, np.nan)
    steps["bytes_sent"] = np.full_like(loss, np.nan)  # one process: nothing goes on a wire
    return steps


def _compare(task, directory):
    """The largest difference of each replica's parameters and buffers from
    rank r's final checkpoint in ``directory``, and whether all are bitwise equal."""
    import torch

    from .checkpoint import checkpoint_path, read_state

    with open(os.path.join(directory, "latest.json")) as f:
        step = json.load(f)["step"]
    worst, equal = [], True
    for r, model in enumerate(task.models):
        saved = read_state(checkpoint_path(directory, r, step))["model"]
        mine = model.state_dict()
        diffs = [float((mine[k].double() - saved[k].double()).abs().max()) for k in saved]
        equal &= all(torch.equal(mine[k], saved[k]) for k in saved)
        worst.append(max(diffs))
    return worst, equal


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    configure_logging()
    problem = _problem(args)
    if problem:
        print(f"experiments.emulate: error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    import torch

    from wagma.results import write_run

    measured = None
    try:
        if args.replay is not None:
            args, schedule, measured = _replayed_args(args)
        torch.set_num_threads(args.threads)
        task = _Task(args, args.ranks)
        args.total = task.steps_per_epoch * args.epochs
        if args.max_steps:
            args.total = min(args.total, args.max_steps)
        parameters = sum(p.numel() for p in task.models[0].parameters())
        if measured is None:
            schedule = _simulated(args, parameters)
    except ValueError as exc:
        print(f"experiments.emulate: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    emulator, loss, evals = _emulate(args, schedule, task)
    out = args.out or os.path.join(
        "runs", f"{args.algo}_p{args.ranks}_{args.model}_{args.dataset}_s{args.seed}_emulated.h5"
    )
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    config = {k: v for k, v in vars(args).items() if k != "total"}
    attrs = {
        "schema": "wagma-run/1",
        "kind": "emulated",
        "status": "complete",
        "algorithm": args.algo,
        "ranks": args.ranks,
        "group_size": schedule.options.get("group_size", 0),
        "tau": schedule.options.get("tau", schedule.options.get("period", 0)),
        "imbalance": args.imbalance,
        "compute": "real",
        "compute_ms": compute_ms(args),
        "model": args.model,
        "dataset": args.dataset,
        "parameters": parameters,
        "batch_size": args.batch_size,
        "seed": args.seed,
        "steps_planned": args.total,
        "steps_per_epoch": task.steps_per_epoch,
        "schedule": schedule.origin,
        "config": json.dumps({**config, "algorithm_options": schedule.options}, default=str),
    }
    write_run(out, attrs, _steps(schedule, measured, loss), evals)
    accuracy = evals["accuracy"][-1] if len(evals["accuracy"]) else math.nan
    print(
        f"wrote {out}: {args.algo} on {args.ranks} emulated ranks, final accuracy {100 * accuracy:.2f} %, "
        f"stale {schedule.stale.mean():.1%}"
    )
    if args.checkpoints:
        worst, equal = _compare(task, args.checkpoints)
        print(
            f"against {args.checkpoints}: {'bitwise equal' if equal else 'differs'}; largest difference per "
            f"rank {', '.join(f'{w:.3g}' for w in worst)}"
        )
        if not equal:
            return EXIT_DIFFERS
    return 0


if __name__ == "__main__":
    sys.exit(main())
