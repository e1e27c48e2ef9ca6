"""The chaos campaign: every algorithm under a stream of failures, without and with replacements, and one long run.

``.venv-openmpi/bin/python -m experiments.campaign chaos`` trains the MLP on
digits on ``--ranks`` ranks (each step padded to ``--compute-ms``) with
each algorithm three ways, under ``experiments.mpirun --fault-tolerant``
(Open MPI's ULFM):

``free``
    no failure;
``chaos``
    ``--chaos mtbf=MTBF,seed=SEED,keep=KEEP,hang=HANG`` (every kind: SIGKILL,
    SIGSEGV, ``os._exit``, SIGSTOP, a rank stuck in its step): the
    survivors go on with fewer ranks;
``healed``
    the same failures, and ``--spares SPARES`` ranks started with the job
    that take the dead ranks' rows (:mod:`collectives.spares`).

``table.md`` gives per algorithm and way: the failures that struck, the
goodput (samples trained per second of the run against the failure-free
run's: every run trains the same steps of the same global batch), the
seconds from each failure to the survivors' next completed step and to the
replacement's first completed step (median and maximum), and the final
accuracy; ``loss.png`` the loss over time of the three runs of each
algorithm, the failures marked.  A job that ended with an error (Open
MPI's ULFM crashes on rare overlapping failures, docs/healing.md) is
counted, and its row reads what its run file kept; one still running
after :data:`HUNG_AFTER` times its failure-free run's time has hung and is
killed with every rank (status -9; its row reads ``hung``).

With ``--long-failures N`` it runs, instead, one long run of ``--long-algo``
with replacements (``1.3 N`` spares, :data:`LONG_MARGIN`) under failures every ``--long-mtbf``
seconds, long enough for ``N`` of them (:func:`long_steps`), beside
failure-free runs of the same steps over ``--long-seeds`` (the first is
the long run's own): ``long.md`` says how many failures struck and how the
loss compares with the other seeds' spread (:func:`tabulate_long`), and
``long.png`` draws it.

The committed record, at the defaults, is ``results/chaos``
(``results/README.md`` says what each file holds).

Times are read from the run files: a failure's time is its strike on the
chaos plan's clock (``chaos`` attribute), whose zero is the training
clock's give or take the start of a step; a stop or a hang counts from
the strike, its ``hang`` seconds included, as a user waits them.
"""

from __future__ import annotations

import glob
import json
import math
import os
import signal
import statistics
import time

import numpy as np

from .campaign_rows import final_accuracy, keep_rows
from .jobs import clear_run, digits_mlp_args
from .jobs import run_training as _run
from .survival import ALGORITHMS as SURVIVAL_ALGORITHMS

__all__ = [
    "ALGORITHMS",
    "WAYS",
    "chaos_table",
    "failure_times",
    "run_chaos",
    "long_steps",
    "run_long",
    "tabulate_chaos",
    "tabulate_long",
]

#: The campaign's algorithms, in the order of its table: the survival campaign's.
ALGORITHMS = SURVIVAL_ALGORITHMS
#: The three runs of each algorithm, as in its files ALGO_WAY.h5.
WAYS = ("free", "chaos", "healed")
#: A run with failures still running after this many times its failure-free run's time (plus a
#: margin for the start) has hung, and is killed with every rank: at the campaign's defaults the
#: runs with failures took less than twice as long as their failure-free run.
HUNG_AFTER = 6
#: The long run lasts this many times the mean time its failures take to come: with N = 100 failures
#: a Poisson stream brings N within 1.3 N mtbf with probability above 0.99 (its sd is 0.1 N mtbf).
LONG_MARGIN = 1.3
#: Steps per window of the long run's loss means, which its verdict compares (:func:`tabulate_long`).
LONG_WINDOW = 100


def _chaos_spec(mtbf, seed, keep, hang):
    return f"mtbf={mtbf:g},seed={seed},keep={keep},hang={hang:g}"


def run_chaos(args, mpiexec, out_dir, algos):
    """The campaign's runs, then :func:`tabulate_chaos`; returns its rows."""
    common = [*digits_mlp_args(args.epochs, args.compute_ms), "--max-steps", str(args.steps)]
    chaos = ["--chaos", _chaos_spec(args.mtbf, args.seed, args.keep, args.hang)]
    for algo in algos:
        deadline = None
        for way in WAYS:
            out = os.path.join(out_dir, f"{algo}_{way}.h5")
            clear_run(out)
            extra = {"free": [], "chaos": chaos, "healed": [*chaos, "--spares", str(args.spares)]}[way]
            ranks = args.ranks + (args.spares if way == "healed" else 0)
            started = time.monotonic()
            status = _run(
                mpiexec, ranks, algo, out, [*common, *extra], True, may_fail=way != "free", deadline_s=deadline
            )
            if way == "free":  # a run with failures still going after many times as long has hung
                deadline = HUNG_AFTER * (time.monotonic() - started) + 120
            _record_status(out, status)
    return tabulate_chaos(out_dir, algos)


def _run_status(status, run) -> str:
    """What the table says of a job that ended with ``status`` (its
    ``.status``) and left ``run``: ``complete``, ``hung`` (still running at
    its deadline, so killed with every rank: status -9) or ``exit N``."""
    if status == 0 and run.attrs["status"] == "complete":
        return "complete"
    return "hung" if status == -signal.SIGKILL else f"exit {status}"


def _record_status(out, status):
    """The job's exit ``status`` beside its run file ``out`` (``OUT.status``), for the table."""
    with open(out + ".status", "w") as f:
        f.write(f"{status}\n")


def failure_times(run) -> list[dict]:
    """The failures that struck ``run`` (a :class:`wagma.results.Run` with a
    ``chaos`` attribute), in order: per row that died (``membership/``), the
    ``row``, the ``step`` the survivors went on from, its ``strike``
    (seconds on the plan's clock: the plan's last event on that row before
    the survivors went on), ``go_on`` (seconds from the strike to the
    survivors' next completed step; None after the last step) and ``joined``
    (seconds from the strike to the first completed step of the replacement
    that took the row next, None where none did)."""
    plan = json.loads(run.attrs["chaos"])
    m = {k: np.asarray(v) for k, v in run.membership.items()}
    if not len(m.get("left", ())):
        return []
    from wagma.results import NOTICED

    clock, skipped = run.steps["clock"], run.steps["skipped"]
    joined = m["noticed"] == NOTICED["joined"]
    deaths: dict[tuple[int, float], list[int]] = {}
    for row, step, at, is_join in zip(m["left"], m["step"], m["clock"], joined, strict=True):
        if not is_join and row >= 0:
            deaths.setdefault((int(step), float(at)), []).append(int(row))
    joins = [(int(row), int(step)) for row, step, is_join in zip(m["left"], m["step"], joined, strict=True) if is_join]
    out = []
    for (step, at), rows in sorted(deaths.items(), key=lambda item: item[0][1]):
        before = max(step - 1, 0)  # the survivors: the other rows that had completed the step before
        alive = [r for r in range(clock.shape[0]) if r not in rows and np.isfinite(clock[r, before])]
        firsts = [f for f in (_first_completed(clock[r], skipped[r], step) for r in alive) if f is not None]
        for row in rows:
            candidates = [t for t, r, _ in plan["events"] if r == row and t <= at + 0.5]
            if not candidates:
                continue
            strike = max(candidates)
            taken = next(((r, s) for r, s in joins if r == row and s >= step), None)
            first_join = _first_completed(clock[row], skipped[row], taken[1]) if taken else None
            if taken:
                joins.remove(taken)
            out.append(
                {
                    "row": row,
                    "step": step,
                    "strike": strike,
                    "go_on": max(firsts) - strike if firsts else None,
                    "joined": None if first_join is None else first_join - strike,
                }
            )
    return out


def _first_completed(clock_row, skipped_row, step):
    done = np.flatnonzero(np.isfinite(clock_row[step:]) & (skipped_row[step:] == 0))
    return float(clock_row[step + done[0]]) if len(done) else None


def _goodput(run) -> float:
    """Samples trained per second of training clock."""
    samples = float(np.nansum(run.steps["samples"]))
    return samples / float(np.nanmax(run.steps["clock"]))


def _spread(values):
    values = [v for v in values if v is not None]
    return (statistics.median(values), max(values)) if values else (math.nan, math.nan)


def tabulate_chaos(out_dir, algos):
    """The rows of ``algos`` from their run files in ``out_dir`` (merged with
    the others kept in ``rows.json``) into ``table.md``, and ``loss.png``;
    returns the rows of ``algos``."""
    from wagma.results import load_run

    rows = []
    for algo in algos:
        free = load_run(os.path.join(out_dir, f"{algo}_free.h5"))
        for way in WAYS[1:]:
            path = os.path.join(out_dir, f"{algo}_{way}.h5")
            if not os.path.exists(path):  # a campaign stopped before it: its row says so
                rows.append({"algorithm": algo, "way": way, "status": "not run"})
                continue
            run = load_run(path)
            with open(path + ".status") as f:
                status = int(f.read())
            failures = failure_times(run)
            rows.append(
                {
                    "algorithm": algo,
                    "way": way,
                    "status": _run_status(status, run),
                    "failures": len(failures),
                    "seconds": float(np.nanmax(run.steps["clock"])),
                    "goodput": _goodput(run) / _goodput(free),
                    "go_on": _spread([f["go_on"] for f in failures]),
                    "joined": _spread([f["joined"] for f in failures]),
                    "final": final_accuracy(run),
                    "free": final_accuracy(free),
                }
            )
    keep_rows(out_dir, rows, algos, ALGORITHMS, chaos_table)
    _plot_losses(out_dir, [a for a in ALGORITHMS if os.path.exists(os.path.join(out_dir, f"{a}_free.h5"))])
    return rows


def chaos_table(rows) -> str:
    """The Markdown table of :func:`tabulate_chaos`'s rows."""
    lines = [
        "| algorithm | replacements | run | failures | run s | goodput | go on, median s | max s | "
        "replacement in, median s | max s | final % | failure-free % |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        way = "spares" if r["way"] == "healed" else "none"
        if r["status"] == "not run":
            lines.append(f"| {r['algorithm']} | {way} | not run (no run file) |" + " |" * 9)
            continue
        joined = " | ".join("-" if math.isnan(v) else f"{v:.2f}" for v in r["joined"])
        lines.append(
            f"| {r['algorithm']} | {way} | {r['status']} | {r['failures']} | {r['seconds']:.0f} | "
            f"{r['goodput']:.2f} | {r['go_on'][0]:.2f} | {r['go_on'][1]:.2f} | {joined} | "
            f"{100 * r['final']:.1f} | {100 * r['free']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def _loss_curve(run, smooth=1):
    """(clock, mean loss over the rows) per step, the loss smoothed over ``smooth`` steps."""
    clock = np.nanmax(run.steps["clock"], axis=0)
    with np.errstate(all="ignore"):
        loss = np.nanmean(run.steps["loss"], axis=0)
    keep = np.isfinite(clock) & np.isfinite(loss)
    clock, loss = clock[keep], loss[keep]
    if smooth > 1 and len(loss) >= smooth:
        loss = np.convolve(loss, np.ones(smooth) / smooth, mode="same")
    return clock, loss


def _plot_losses(out_dir, algos):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from wagma.results import load_run

    if not algos:
        return
    columns = min(3, len(algos))
    fig, axes = plt.subplots(
        math.ceil(len(algos) / columns), columns, figsize=(5 * columns, 3.2 * math.ceil(len(algos) / columns))
    )
    for ax, algo in zip(np.atleast_1d(axes).ravel(), algos, strict=False):
        for way, colour in zip(WAYS, ("black", "tab:red", "tab:blue"), strict=True):
            path = os.path.join(out_dir, f"{algo}_{way}.h5")
            if not os.path.exists(path):
                continue
            run = load_run(path)
            ax.plot(*_loss_curve(run, smooth=10), color=colour, lw=1, label=way)
            if way != "free":
                for failure in failure_times(run):
                    ax.axvline(failure["strike"], color=colour, lw=0.5, alpha=0.4)
        ax.set_title(algo)
        ax.set_xlabel("training clock, s")
        ax.set_ylabel("loss (10-step mean)")
        ax.set_yscale("log")
    np.atleast_1d(axes).ravel()[0].legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "loss.png"), dpi=120)
    plt.close(fig)


def long_steps(failures, mtbf, landing, recovery_s, step_s) -> int:
    """The long run's steps, for ``LONG_MARGIN * failures`` failures to
    strike on average.

    Failures come at ``1 / mtbf`` a second of wall clock, and a share
    ``landing`` of them strike a rank (the others fall on a row left vacant
    while its rank is stopped, hung or being replaced: they strike nobody,
    :mod:`wagma.chaos`).  A run of W seconds therefore sees ``landing * W /
    mtbf`` failures, and each costs ``recovery_s`` of it, so that F failures
    need W = F mtbf / landing, of which F (mtbf / landing - recovery_s)
    trains, at ``step_s`` seconds a step (the failure-free pace).

    Raises:
        ValueError: ``mtbf / landing <= recovery_s``: the failures would leave
            no time to train.
    """
    training_s = LONG_MARGIN * failures * (mtbf / landing - recovery_s)
    if training_s <= 0:
        raise ValueError(
            f"--long-mtbf {mtbf:g} leaves no time to train when --long-landing {landing:g} of the failures land "
            f"and each costs --long-recovery-s {recovery_s:g}: the mtbf must exceed {recovery_s * landing:g}"
        )
    return math.ceil(training_s / step_s)


def run_long(args, mpiexec, out_dir):
    """The long run and its failure-free seeds (module docstring); writes
    ``long.md`` and ``long.png`` and returns the verdict's numbers."""
    from wagma.results import load_run

    algo = args.long_algo
    steps = args.long_steps
    if not steps:  # from the failure-free pace: a probe of 100 steps
        probe = os.path.join(out_dir, "long_probe.h5")
        clear_run(probe)
        common = digits_mlp_args(args.epochs, args.compute_ms)
        _run(mpiexec, args.ranks, algo, probe, [*common, "--max-steps", "100"], fault_tolerant=True)
        step_s = float(np.nanmax(load_run(probe).steps["clock"])) / 100
        steps = long_steps(args.long_failures, args.long_mtbf, args.long_landing, args.long_recovery_s, step_s)
    common = digits_mlp_args(max(args.epochs, steps), args.compute_ms)  # epochs above the steps: --max-steps ends it
    seeds = [int(s) for s in args.long_seeds.split(",")]
    out = os.path.join(out_dir, "long_healed.h5")
    clear_run(out)
    # A spare per failure that strikes, of which long_steps plans LONG_MARGIN times those asked for: a
    # join that another failure interrupts costs no spare (collectives.spares.SparePool.wait).  No more:
    # the pool's start costs a communicator per spare over the whole world (2.5 min for 110 spares and
    # 8 members on 2 cores), and where they run out the run goes on shrinking.
    spares = math.ceil(LONG_MARGIN * args.long_failures)
    chaos = _chaos_spec(args.long_mtbf, args.seed, args.keep, args.hang)
    extra = ["--max-steps", str(steps), "--seed", str(seeds[0]), "--chaos", chaos, "--spares", str(spares)]
    deadline = HUNG_AFTER * LONG_MARGIN * args.long_failures * args.long_mtbf / args.long_landing + 600
    status = _run(mpiexec, args.ranks + spares, algo, out, [*common, *extra], True, may_fail=True, deadline_s=deadline)
    _record_status(out, status)
    # The failure-free seeds after the long run, not before: a long run that hangs shows within its own
    # deadline rather than after an hour of runs that cannot fail.
    for stale in glob.glob(os.path.join(out_dir, "long_free_s*.h5")):  # tabulate_long reads every seed's
        clear_run(stale)
    for seed in seeds:
        free = os.path.join(out_dir, f"long_free_s{seed}.h5")
        _run(mpiexec, args.ranks, algo, free, [*common, "--max-steps", str(steps), "--seed", str(seed)], True)
    return tabulate_long(out_dir)


def _window_means(run, window):
    """The loss (the rows' mean at each step) averaged over consecutive windows of ``window`` steps."""
    with np.errstate(all="ignore"):
        loss = np.nanmean(run.steps["loss"], axis=0)
        windows = len(loss) // window
        return np.nanmean(loss[: windows * window].reshape(windows, window), axis=1)


def tabulate_long(out_dir):
    """``long.md`` and ``long.png`` from the long run's files in ``out_dir``
    (``long_healed.h5`` and its ``.status``, ``long_free_s*.h5``); returns the figures.

    The verdict on the loss, per window of :data:`LONG_WINDOW` steps (the
    mean loss over the window): the share of the long run's windows within
    the failure-free band, from the lowest to the highest failure-free run
    of every seed, its own seed's included.  Its own seed's failure-free
    run (its twin: the same data order) is the reference beside it, since a
    seed's curve is not one draw of the others' at every window: the data
    order keeps a seed's loss above or below another's over long stretches
    (seed 0 lies within seeds 1 and 2's range in 69 % of its windows at the
    campaign's defaults, not the 1/3 of exchangeable draws).  So the long
    run and its twin are placed alike against the other seeds' range, the
    share of windows within it and above it: failures that hurt training
    show as more windows above it than the twin's.

    Raises:
        ValueError: the failure-free run of the long run's seed, or two
            other seeds' at least, are missing.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from wagma.results import is_partial, load_run

    healed_path = os.path.join(out_dir, "long_healed.h5")
    with open(healed_path + ".status") as f:
        status = int(f.read())
    healed = load_run(healed_path)
    seed = int(healed.attrs["seed"])
    frees = {}
    for path in sorted(glob.glob(os.path.join(out_dir, "long_free_s*.h5"))):
        if not is_partial(path):
            run = load_run(path)
            frees[int(run.attrs["seed"])] = run
    if seed not in frees or len(frees) < 3:
        raise ValueError(
            f"the long run (seed {seed}) needs the failure-free run of its seed and of two others at least in "
            f"{out_dir}; found seeds {sorted(frees)}"
        )
    twin = frees.pop(seed)
    spread = [_window_means(run, LONG_WINDOW) for run in frees.values()]
    healed_means, twin_means = _window_means(healed, LONG_WINDOW), _window_means(twin, LONG_WINDOW)
    windows = min(len(m) for m in [*spread, healed_means, twin_means])
    low = np.min([m[:windows] for m in spread], axis=0)
    high = np.max([m[:windows] for m in spread], axis=0)
    healed_means, twin_means = healed_means[:windows], twin_means[:windows]
    band = np.minimum(low, twin_means), np.maximum(high, twin_means)  # every seed's failure-free run

    def placement(means, low=low, high=high):
        return float(np.mean((means >= low) & (means <= high))), float(np.mean(means > high))

    failures = failure_times(healed)
    figures = {
        "status": _run_status(status, healed),
        "seed": seed,
        "other_seeds": sorted(frees),
        "failures": len(failures),
        "joins": int(healed.summary.get("ranks_joined", 0)),
        "seconds": float(np.nanmax(healed.steps["clock"])),
        "free_seconds": float(np.nanmax(twin.steps["clock"])),
        "steps": int(healed.steps["loss"].shape[1]),
        "band_placement": placement(healed_means, *band),
        "placement": placement(healed_means),
        "twin_placement": placement(twin_means),
        "go_on": _spread([f["go_on"] for f in failures]),
        "joined": _spread([f["joined"] for f in failures]),
        "final": final_accuracy(healed),
        "twin_final": final_accuracy(twin),
        "free": {s: final_accuracy(run) for s, run in frees.items()},
    }
    others = ", ".join(str(s) for s in sorted(frees))
    every = ", ".join(str(s) for s in sorted([seed, *frees]))
    inside, above = figures["placement"]
    twin_inside, twin_above = figures["twin_placement"]
    with open(os.path.join(out_dir, "long.md"), "w") as f:
        f.write(
            f"| seed {seed} | run | failures | replacements | run s | steps | windows within the failure-free "
            f"band of seeds {every} | within seeds {others} | above them | go on, median / max s | "
            "replacement in, median / max s | final % |\n"
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n"
            f"| with failures and spares | {figures['status']} | {figures['failures']} | {figures['joins']} | "
            f"{figures['seconds']:.0f} | {figures['steps']} | {100 * figures['band_placement'][0]:.1f} % | "
            f"{100 * inside:.1f} % | {100 * above:.1f} % | "
            f"{figures['go_on'][0]:.2f} / {figures['go_on'][1]:.2f} | "
            f"{figures['joined'][0]:.2f} / {figures['joined'][1]:.2f} | {100 * figures['final']:.1f} |\n"
            f"| failure-free | complete | 0 | 0 | {figures['free_seconds']:.0f} | {twin.steps['loss'].shape[1]} | "
            f"- | {100 * twin_inside:.1f} % | {100 * twin_above:.1f} % | - | - | {100 * figures['twin_final']:.1f} |\n"
            f"\nA window is {LONG_WINDOW} steps, its loss the mean over them.  The failure-free run of seed "
            f"{seed} has the long run's data order: beside the other seeds it is the reference for the long "
            f"run.  Final accuracy of seeds {others}: "
            + ", ".join(f"{100 * a:.1f} %" for a in figures["free"].values())
            + ".\n"
        )
    fig, ax = plt.subplots(figsize=(9, 4))
    x = (np.arange(windows) + 0.5) * LONG_WINDOW
    ax.fill_between(x, low, high, color="0.8", label=f"failure-free, seeds {others}")
    ax.plot(x, twin_means, color="0.3", lw=1, label=f"failure-free, seed {seed}")
    ax.plot(x, healed_means, color="tab:blue", lw=1, label=f"seed {seed}, failures, spares")
    for failure in failures:
        ax.axvline(failure["step"], color="tab:red", lw=0.3, alpha=0.5)
    ax.set_xlabel(f"step (failures in red: {len(failures)})")
    ax.set_ylabel(f"loss ({LONG_WINDOW}-step mean)")
    ax.set_yscale("log")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "long.png"), dpi=120)
    plt.close(fig)
    with open(os.path.join(out_dir, "long.md")) as f:
        print("\n" + f.read(), flush=True)
    return figures
