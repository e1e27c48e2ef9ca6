"""Measure the allreduce tuning table for the MPI library, rank count and node shape at hand.

Times each of our allreduce schedules and the library's own ``MPI_Allreduce``
on float32 buffers from 4 KiB to 256 MiB (by default), side by side in one
run, and writes the medians as a tuning table (:mod:`collectives.schedules.tuning`),
``results/tuning/<library>-<version>-n<ranks>-<nodes>x<ranks per node>.json``,
which ``allreduce(algorithm="auto")`` then reads.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
from collections.abc import Sequence

import numpy as np
from mpi4py import MPI

from ..comm import Communicator
from ..mpi_library import mpi_library
from ..schedules.blocking import ALLREDUCE_ALGORITHMS, AllreduceChoice
from ..schedules.tuning import DEFAULT_TUNING_DIR, TuningTable, table_name, tuning_setting
from .allreduce import measure_bytes, parse_sizes, size_label

__all__ = ["main"]


def _table(sizes, names, median):
    head = f"{'size':>9} " + " ".join(f"{n:>18}" for n in names) + f" {'fastest':>18} {'auto/MPI':>9}"
    lines = ["median ms (max over ranks); auto/MPI: MPI_Allreduce's time over the fastest's", head]
    for j, nbytes in enumerate(sizes):
        size = size_label(nbytes)
        best = int(np.argmin(median[:, j]))
        cells = " ".join(f"{median[i, j] * 1e3:18.3f}" for i in range(len(names)))
        lines.append(f"{size:>9} {cells} {names[best]:>18} {median[0, j] / median[best, j]:8.2f}x")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=".venv/bin/python -m experiments.mpirun -n 4 -- .venv/bin/python -m mpi4py -m collectives.bench tune",
        description="Measure which allreduce is fastest at each size for this MPI library, rank count and "
        "node shape, and write the tuning table that algorithm='auto' reads.",
    )
    parser.add_argument(
        "--sizes",
        default="4KiB:256MiB",
        help="LO:HI (every power of 4 from LO to HI) or comma-separated sizes, with KiB/MiB/GiB or in bytes",
    )
    parser.add_argument("--reps", type=int, default=5, help="timed repetitions per size")
    parser.add_argument("--warmup", type=int, default=1, help="untimed repetitions before them")
    parser.add_argument(
        "--out-dir", default=DEFAULT_TUNING_DIR, help="folder of the table (the repository's results/tuning)"
    )
    args = parser.parse_args(argv)
    try:
        sizes = parse_sizes(args.sizes)
    except ValueError as exc:
        parser.error(f"--sizes: cannot read {exc} (e.g. 4KiB:256MiB or 4096,65536)")
    if not sizes or min(sizes) < 4 or args.reps < 1 or args.warmup < 0:
        parser.error("--sizes must give sizes of 4 bytes or more, --reps >= 1, --warmup >= 0")
    with Communicator(MPI.COMM_WORLD) as comm:
        setting = tuning_setting(comm.data)
        names: list[AllreduceChoice] = ["mpi", *ALLREDUCE_ALGORITHMS]
        times = measure_bytes(comm, sizes, names, args.reps, args.warmup)
        if comm.rank:
            return 0
        median = np.median(times, axis=2)
        description = mpi_library()[2]
        record = TuningTable(
            {
                **setting,
                "sizes_bytes": sizes,
                "median_seconds": {name: median[i].tolist() for i, name in enumerate(names)},
            }
        ).to_record()
        record.update(
            description=description,
            dtype="float32",
            reps=args.reps,
            warmup=args.warmup,
            cores_per_node=os.cpu_count(),
            timing="max over ranks, barrier to return, seconds",
            fastest=[names[int(i)] for i in np.argmin(median, axis=0)],
            measured=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        )
        print(
            f"allreduce tuning on {comm.size} ranks ({setting['nodes']} x {setting['ranks_per_node']}), "
            f"{os.cpu_count()} cores per node, "
            f"{description}"
        )
        print(_table(sizes, ["MPI_Allreduce" if n == "mpi" else n for n in names], median))
        os.makedirs(args.out_dir, exist_ok=True)
        path = os.path.join(args.out_dir, table_name(**setting))
        with open(path, "w") as f:
            json.dump(record, f, indent=1)
            f.write("\n")
        print(f"wrote {path}")
    return 0
