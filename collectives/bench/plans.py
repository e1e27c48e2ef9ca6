"""What a StragglAR plan costs at n ranks, before and after plans are shared.

Before: each rank, at each newly predicted straggler, generated and verified
the schedule for it and picked out its own rounds (``verify(generate(n, s))``
and the runtime's walk over every transfer).  After
(:mod:`collectives.stragglar.plans`): the plan of n is generated and verified
once, by rank 0, or read from the plan cache and checked by its digest, and
broadcast; a new straggler then costs each rank the selection of its rows
(:func:`~collectives.stragglar.plans.rank_steps`).

Generation needs no processes, so n = 4096 is measured on one; the broadcast
is measured among the ranks launched (``mpiexec -n P``), rank 0 sending the
plan of n to the others.  Every figure is the median of ``--reps`` runs on
rank 0, in seconds::

    .venv/bin/python -m experiments.mpirun -n 8 -- .venv/bin/python -m mpi4py -m collectives.bench plans
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable, Sequence

import numpy as np
from mpi4py import MPI

from ..provenance import results_file, run_attributes
from ..schedules.partition import block_offsets
from ..stragglar import generate, plans, verify
from ..stragglar.runtime import _my_steps

__all__ = ["main", "measure"]

#: The columns of the table and of the HDF5 dataset ``plans``, in seconds but for the first three.
COLUMNS = (
    "n",
    "transfers",
    "plan_mib",
    "before_generate",
    "before_verify",
    "before_own_rounds",
    "before_new_straggler",
    "after_build_cold",
    "after_load_warm",
    "after_share",
    "after_new_straggler",
)


def _median(fn: Callable[[], object], reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def _idle_until_all_arrive(comm: MPI.Intracomm) -> None:
    """A barrier whose waiting ranks sleep between tests, so that rank 0's
    serial measurements are not timed against ranks spinning in MPI."""
    request = comm.Ibarrier()
    while not request.Test():
        time.sleep(0.005)


def measure(comm: MPI.Intracomm, n: int, reps: int, folder: str) -> dict[str, float]:
    """One row of :data:`COLUMNS` for ``n`` (collective: the share is timed
    among ``comm``'s ranks; the rest on rank 0, the others wait)."""
    row: dict[str, float] = {"n": n}
    straggler, rank = n // 2, 1
    chunks = block_offsets(1 << 20, n - 1)
    if comm.rank == 0:
        schedule = generate(n, straggler)
        row["before_generate"] = _median(lambda: generate(n, straggler), reps)
        row["before_verify"] = _median(lambda: verify(schedule), reps)
        row["before_own_rounds"] = _median(lambda: _my_steps(schedule, rank, chunks), reps)
        row["before_new_straggler"] = row["before_generate"] + row["before_verify"] + row["before_own_rounds"]
        plan = plans.build_plan(n)
        row["transfers"] = len(plan.transfers)
        row["plan_mib"] = (plan.transfers.nbytes + plan.round_starts.nbytes) / 2**20
        row["after_build_cold"] = _median(lambda: plans.build_plan(n), reps)
        plans.store_plan(folder, plan)
        row["after_load_warm"] = _median(lambda: plans.load_plan(folder, n), reps)
        row["after_new_straggler"] = _median(lambda: plans.rank_steps(plan, straggler, rank, chunks), reps)
    _idle_until_all_arrive(comm)  # the others wait without spinning, leaving rank 0 the cores
    os.environ[plans.PLAN_CACHE_ENV] = comm.bcast(folder)  # rank 0's, which it just filled

    def share():
        plans._plans.pop(n, None)
        comm.Barrier()
        plans.shared_plan(comm, n)

    share_s = _median(share, reps) if comm.size > 1 else float("nan")
    row["after_share"] = share_s
    return row


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=".venv/bin/python -m experiments.mpirun -n 8 -- .venv/bin/python -m mpi4py -m collectives.bench plans",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--n", default="256,1024,4096", help="ranks the plans are for, comma-separated")
    parser.add_argument("--reps", type=int, default=3, help="timed repetitions of each step")
    parser.add_argument("--out", default=None, help="HDF5 file [results/stragglar_plans/plans_pP.h5]")
    args = parser.parse_args(argv)
    try:
        ns = [int(v) for v in args.n.split(",")]
    except ValueError:
        parser.error(f"--n must be integers separated by commas, got {args.n!r}")
    if any(n < 2 for n in ns) or args.reps < 1:
        parser.error(f"--n needs every n >= 2 and --reps >= 1, got --n {args.n} --reps {args.reps}")
    comm = MPI.COMM_WORLD
    attrs = run_attributes(comm)
    saved = os.environ.get(plans.PLAN_CACHE_ENV)
    with tempfile.TemporaryDirectory() as folder:
        rows = [measure(comm, n, args.reps, folder) for n in ns]
    if saved is None:
        os.environ.pop(plans.PLAN_CACHE_ENV, None)
    else:
        os.environ[plans.PLAN_CACHE_ENV] = saved
    if comm.rank != 0:
        return 0
    cores = os.cpu_count()
    print(f"StragglAR plans: medians of {args.reps} on rank 0; the share among {comm.size} ranks on {cores} cores")
    print(
        "| n | transfers | plan (MiB) | before: each rank, each new straggler (s) | "
        "after: rank 0, cold cache (s) | warm cache (s) | share (s) | new straggler (ms) |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(
            f"| {row['n']} | {row['transfers']} | {row['plan_mib']:.1f} | {row['before_new_straggler']:.2f} "
            f"(generate {row['before_generate']:.2f}, verify {row['before_verify']:.2f}, own rounds "
            f"{row['before_own_rounds']:.2f}) | {row['after_build_cold']:.2f} | {row['after_load_warm']:.3f} | "
            f"{row['after_share']:.3f} | {1e3 * row['after_new_straggler']:.1f} |"
        )
    attrs["cores"] = cores
    with results_file(args.out, f"stragglar_plans/plans_p{comm.size}.h5", attrs) as f:
        table = np.array([tuple(float(row[c]) for c in COLUMNS) for row in rows], dtype=[(c, "f8") for c in COLUMNS])
        f.create_dataset("plans", data=table)
    return 0
