"""The relaunch campaign: what a dead rank costs where there is no fault tolerance, through the Slurm scripts.

``.venv/bin/python -m experiments.campaign relaunch`` submits
``slurm/train.sbatch`` (srun with the library's plugin, no ULFM) for each
algorithm that checkpoints: the MLP on digits on ``--ranks`` ranks, each
step padded to ``--compute-ms``, a checkpoint every ``--checkpoint-every``
steps; once without a fault and ``--repeats`` times with a rank killed
(``--fault kill``, SIGKILL) at ``--kill-at`` of the run: rank 0 in the
first repeat, a rank drawn from ``--seed`` in the others.  srun ends the
step, and ``slurm/train-job.sh`` completes the run file, keeps the failed
segment's (``NAME.failed-1.h5``) and relaunches inside the allocation on
the ranks left from the last checkpoint.  It runs on the Slurm that
``SLURM_CONF`` names, or on the one-node Slurm of ``scripts/local-slurm``
that it starts.

``table.md`` gives per algorithm, median and maximum over the repeats, the
time lost per failure and its two parts, read from the run files:

* *redone*: the training done again: the victim's clock at its last step
  in the failed segment (it died at the start of the next) minus the
  clock of the checkpoint the relaunch went on from (the membership row's
  ``clock``); on average half a checkpoint interval;
* *relaunch*: from the death to the relaunched ranks' first step (the
  membership row's ``recovery_s``): srun ending the step, the run file
  completed, the launch, imports, set-up and the checkpoint's load;

and, from Slurm's whole seconds, the killed job's wall time minus the
failure-free job's, and the final accuracies.  The reference campaign is
committed in results/relaunch/.  ensemble_sync is not here:
it takes no checkpoints (its ranks are never at one step together) and
survives only under ULFM (:mod:`experiments.survival`).
"""

from __future__ import annotations

import glob
import json
import os
import random
import shutil
import statistics
import sys
import tempfile

import numpy as np

from .campaign_rows import final_accuracy, keep_rows
from .jobs import digits_mlp_args
from .slurm_jobs import job_seconds, local_slurm, submit, wait_for

__all__ = ["ALGORITHMS", "lost_seconds", "relaunch_table", "run_relaunch", "tabulate_relaunch"]

#: The campaign's algorithms (every one that checkpoints), in the order of its table.
ALGORITHMS = ("allreduce_sgd", "local_sgd", "wagma", "eager_sgd", "hierarchical_sgd", "dpsgd", "adpsgd", "sgp")
_JOB_DEADLINE_S = 1800


def lost_seconds(run, failed) -> tuple[float, float]:
    """``(redone, relaunch)`` seconds of the one relaunch in ``run`` (the
    completed run file, a :class:`wagma.results.Run`) whose failed segment
    is ``failed`` (see the module docstring)."""
    from wagma.results import NOTICED

    (change,) = np.flatnonzero(run.membership["noticed"] == NOTICED["relaunch"])
    victim = int(run.membership["left"][change])
    died = float(np.nanmax(failed.steps["clock"][victim]))
    return died - float(run.membership["clock"][change]), float(run.membership["recovery_s"][change])


def relaunch_table(rows) -> str:
    """The Markdown table of :func:`tabulate_relaunch`'s rows."""
    lines = [
        "| algorithm | ranks | runs | lost, median s | maximum s | redone, median s | relaunch, median s "
        "| job longer by, median s | final % | failure-free % |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['algorithm']} | {r['ranks']} | {r['runs']} | {r['lost_median_s']:.1f} | {r['lost_max_s']:.1f} | "
            f"{r['redone_median_s']:.1f} | {r['relaunch_median_s']:.1f} | {r['job_longer_median_s']:.0f} | "
            f"{100 * r['final']:.1f} | {100 * r['free']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def run_relaunch(args, out_dir, algos):
    """The campaign's jobs, then :func:`tabulate_relaunch`; returns its rows."""
    from wagma.datasets import load_dataset

    total = load_dataset("digits", rank=0, ranks=args.ranks).steps_per_epoch(16) * args.epochs
    kill_at = int(args.kill_at * total)
    draw = random.Random(args.seed)
    common = [*digits_mlp_args(args.epochs, args.compute_ms), "--checkpoint-every", str(args.checkpoint_every)]
    runs = {}  # name -> the fault, or None
    for algo in algos:
        runs[f"{algo}_none"] = None
        for repeat in range(args.repeats):
            victim = 0 if repeat == 0 else draw.randrange(1, args.ranks)
            runs[f"{algo}_kill_{repeat}"] = f"kill:rank={victim},step={kill_at}"
    if os.environ.get("SLURM_CONF"):
        seconds = _submit_all(dict(os.environ), args, out_dir, runs, common)
    else:
        with tempfile.TemporaryDirectory(prefix="relaunch-slurm-") as folder, local_slurm(folder, args.ranks) as env:
            seconds = _submit_all(env, args, out_dir, runs, common)
    _merge_json(os.path.join(out_dir, "jobs.json"), seconds)
    return tabulate_relaunch(out_dir, algos)


def _algorithm(name):
    """The algorithm of run ``name``: ``ALGO_none`` or ``ALGO_kill_K``."""
    return name.rsplit("_kill_", 1)[0] if "_kill_" in name else name.removesuffix("_none")


def _submit_all(env, args, out_dir, runs, common):
    """Submit every run (the node takes one job of ``--ranks`` ranks at a
    time), wait, and put each run's files in ``out_dir`` under its name;
    returns each job's wall seconds."""
    env = {**env, "PYTHON": sys.executable}
    jobs = {}
    for name, fault in runs.items():
        folder = os.path.join(out_dir, name)
        shutil.rmtree(folder, ignore_errors=True)
        algo = _algorithm(name)
        extra = [*common, "--fault", fault] if fault else common
        settings = {
            "ALGO": algo,
            "MODEL": "mlp",
            "DATASET": "digits",
            "EPOCHS": str(args.epochs),
            "BATCH_SIZE": "16",
            "TRAIN_ARGS": " ".join(extra),
            "RESULTS_DIR": os.path.abspath(folder),
        }
        log = os.path.abspath(os.path.join(out_dir, f"{name}.log"))
        jobs[name] = submit(env, settings, "slurm/train.sbatch", f"--output={log}", ranks=args.ranks)
        print(f"submitted {name}: job {jobs[name]}", flush=True)
    states = wait_for(env, list(jobs.values()), _JOB_DEADLINE_S * len(jobs))
    seconds = {}
    for (name, job), state in zip(jobs.items(), states):
        folder = os.path.join(out_dir, name)
        algo = _algorithm(name)
        for path in glob.glob(os.path.join(folder, f"{algo}_{job}*.h5")):
            os.replace(path, os.path.join(out_dir, os.path.basename(path).replace(f"{algo}_{job}", name)))
        shutil.rmtree(folder, ignore_errors=True)  # the checkpoints
        seconds[name] = job_seconds(state)
        print(f"{name}: {state['JobState']} in {seconds[name]:.0f} s", flush=True)
    return seconds


def _merge_json(path, values):
    earlier = {}
    if os.path.exists(path):
        with open(path) as f:
            earlier = json.load(f)
    with open(path, "w") as f:
        json.dump({**earlier, **values}, f, indent=1, sort_keys=True)


def tabulate_relaunch(out_dir, algos):
    """The rows of ``algos`` from their run files in ``out_dir`` and the
    jobs' wall seconds in ``jobs.json`` there, merged with the other
    algorithms' rows kept in ``rows.json``, into ``table.md``; returns the
    rows of ``algos``."""
    from wagma.results import load_run

    with open(os.path.join(out_dir, "jobs.json")) as f:
        seconds = json.load(f)
    rows = []
    for algo in algos:
        free = load_run(os.path.join(out_dir, f"{algo}_none.h5"))
        losses, redone, relaunch, longer, finals = [], [], [], [], []
        killed = glob.glob(os.path.join(out_dir, f"{algo}_kill_*.h5"))
        for path in sorted(p for p in killed if ".failed-" not in p):
            run = load_run(path)
            name = os.path.basename(path)[: -len(".h5")]
            part = lost_seconds(run, load_run(path[: -len(".h5")] + ".failed-1.h5"))
            redone.append(part[0])
            relaunch.append(part[1])
            losses.append(sum(part))
            longer.append(seconds[name] - seconds[f"{algo}_none"])
            finals.append(final_accuracy(run))
        rows.append(
            {
                "algorithm": algo,
                "ranks": int(free.attrs["ranks"]),
                "runs": len(losses),
                "lost_median_s": statistics.median(losses),
                "lost_max_s": max(losses),
                "redone_median_s": statistics.median(redone),
                "relaunch_median_s": statistics.median(relaunch),
                "job_longer_median_s": statistics.median(longer),
                "final": statistics.mean(finals),
                "free": final_accuracy(free),
            }
        )
    keep_rows(out_dir, rows, algos, ALGORITHMS, relaunch_table)
    return rows
