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
only for evaluations, which these runs do at the end alone.  A run with no
membership change (``ensemble_sync`` with a non-zero victim: the
coordinator leaves the dead rank out of its rounds, nobody shrinks) gives
the longest step a survivor took from the death on instead.

The table is read from the run files (:func:`tabulate_survival`; ``--tabulate``
reads those already in ``--out-dir`` without running), and ``rows.json``
keeps every algorithm's rows, so that ``--algos`` refreshes some of them.
The reference campaign is committed in results/survival/.
"""

from __future__ import annotations

import glob
import json
import os
import random
import statistics

import numpy as np

from .campaign_rows import final_accuracy, keep_rows
from .jobs import clear_run, digits_mlp_args
from .jobs import run_training as _run

__all__ = ["ALGORITHMS", "recovery_seconds", "run_survival", "survival_table", "tabulate_survival"]


def recovery_seconds(run, victim: int) -> float:
    """Seconds from ``victim``'s death to the survivors' next completed step
    in ``run`` (a :class:`wagma.results.Run`; see the module docstring).

    A run with no membership change for ``victim`` (``ensemble_sync``'s
    non-zero ranks: the survivors keep their communicator and the
    coordinator leaves the dead rank out of its rounds) gives the longest
    step a survivor took from the death on, its compute included: the
    round it stalls is where the death costs them."""
    clock, skipped = run.steps["clock"], run.steps["skipped"]
    died = float(np.nanmax(clock[victim]))
    if victim not in set(run.membership.get("left", ())):
        last = int(np.flatnonzero(np.isfinite(clock[victim]))[-1])
        survivors = [r for r in range(clock.shape[0]) if r != victim]
        return float(np.nanmax(np.diff(clock[survivors, last:], axis=1)))
    resumed = int(run.membership["step"][list(run.membership["left"]).index(victim)])
    survivors = [r for r in range(clock.shape[0]) if r != victim and r not in set(run.membership["left"])]
    firsts = []
    for rank in survivors:
        done = np.flatnonzero(np.isfinite(clock[rank, resumed:]) & (skipped[rank, resumed:] == 0))
        firsts.append(clock[rank, resumed + done[0]])
    return float(max(firsts) - died)


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


#: The campaign's algorithms, in the order of its table.
ALGORITHMS = (
    "allreduce_sgd",
    "local_sgd",
    "wagma",
    "eager_sgd",
    "hierarchical_sgd",
    "dpsgd",
    "adpsgd",
    "sgp",
    "ensemble_sync",
)
#: The killed runs' files: ALGO_kill_K.h5 (a non-zero rank), ALGO_kill0_K.h5 (rank 0).
_VICTIMS = (("a rank", "kill"), ("rank 0", "kill0"))


def run_survival(args, mpiexec, out_dir, algos):
    """The campaign's runs, then :func:`tabulate_survival`; returns its rows."""
    from wagma.datasets import load_dataset

    total = load_dataset("digits", rank=0, ranks=args.ranks).steps_per_epoch(16) * args.epochs
    kill_at = int(args.kill_at * total)
    draw = random.Random(args.seed)
    common = digits_mlp_args(args.epochs, args.compute_ms)
    for algo in algos:
        free_out = os.path.join(out_dir, f"{algo}_none.h5")
        clear_run(free_out)
        _run(mpiexec, args.ranks, algo, free_out, common, fault_tolerant=True)
        for victim_kind, prefix in _VICTIMS:
            for repeat in range(args.repeats):
                victim = 0 if victim_kind == "rank 0" else draw.randrange(1, args.ranks)
                out = os.path.join(out_dir, f"{algo}_{prefix}_{repeat}.h5")
                clear_run(out)
                fault = f"kill:rank={victim},step={kill_at},how={args.how}"
                _run(mpiexec, args.ranks, algo, out, [*common, "--fault", fault], fault_tolerant=True)
    return tabulate_survival(out_dir, algos)


def tabulate_survival(out_dir, algos):
    """The rows of ``algos`` from their run files in ``out_dir``, merged with
    the other algorithms' rows kept in ``rows.json`` there (so that a
    campaign of some algorithms refreshes theirs), into ``table.md``;
    returns the rows of ``algos``.  The victim and how it died are read
    from each run's fault plan."""
    from wagma.results import load_run

    rows = []
    for algo in algos:
        free = final_accuracy(load_run(os.path.join(out_dir, f"{algo}_none.h5")))
        for victim_kind, prefix in _VICTIMS:
            paths = sorted(glob.glob(os.path.join(out_dir, f"{algo}_{prefix}_*.h5")))
            if not paths:
                continue
            times, finals, hows = [], [], set()
            for path in paths:
                run = load_run(path)
                (kill,) = [fault for fault in json.loads(run.attrs["faults"]) if fault["kind"] == "kill"]
                times.append(recovery_seconds(run, int(kill["rank"])))
                finals.append(final_accuracy(run))
                hows.add(kill["how"])
            rows.append(
                {
                    "algorithm": algo,
                    "ranks": int(run.attrs["ranks"]),
                    "victim": victim_kind,
                    "how": ", ".join(sorted(hows)),
                    "runs": len(paths),
                    "median_s": statistics.median(times),
                    "max_s": max(times),
                    "final": statistics.mean(finals),
                    "free": free,
                }
            )
    keep_rows(out_dir, rows, algos, ALGORITHMS, survival_table)
    return rows
