"""Allreduce bandwidth: our schedules, and ``auto``, against the MPI library's Allreduce.

Ours are called with ``check=False``: the argument check (one small allgather
on the control channel) costs the same whichever schedule runs, and the
library's own call has none, so the columns compare the schedules alone.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

import numpy as np
from mpi4py import MPI

from ..comm import Communicator
from ..provenance import results_file, run_attributes
from ..schedules.blocking import ALLREDUCE_ALGORITHMS, ALLREDUCE_CHOICES, AllreduceAlgorithm, allreduce

__all__ = ["main", "measure", "measure_bytes"]

MIB = 1 << 20
#: What ``--algorithms`` accepts - our schedules, "mpi" (the library's
#: Allreduce through our call) and "auto" (the tuning table's choice).
CHOICES = (*ALLREDUCE_CHOICES, "auto")


def _mpi_allreduce(x, comm):
    comm.data.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)


def _ours(algorithm):
    def run(x, comm):
        allreduce(x, comm=comm, algorithm=algorithm, check=False)

    return run


def measure_bytes(
    comm: Communicator,
    sizes_bytes: Sequence[int],
    algorithms: Sequence[AllreduceAlgorithm],
    reps: int,
    warmup: int,
    library_column: bool = False,
) -> np.ndarray:
    """Time each of ``algorithms`` (values of ``allreduce(algorithm=...)``) on
    float32 buffers of ``sizes_bytes``; returns seconds [impl, size, rep], the
    first impl the library's plain ``MPI_Allreduce`` when ``library_column``.

    A repetition is timed from a barrier to the slowest rank's return (the
    maximum over ranks).  Implementations take turns within each repetition,
    so drift in the machine's load affects all of them alike.
    """
    impls = [_mpi_allreduce] if library_column else []
    impls += [_ours(name) for name in algorithms]
    times = np.zeros((len(impls), len(sizes_bytes), reps))
    for j, nbytes in enumerate(sizes_bytes):
        # Zeros stay finite however often they are summed in place.
        x = np.zeros(int(nbytes) // 4, dtype=np.float32)
        for rep in range(-warmup, reps):
            for i, run in enumerate(impls):
                comm.data.Barrier()
                start = MPI.Wtime()
                run(x, comm)
                elapsed = comm.data.allreduce(MPI.Wtime() - start, op=MPI.MAX)
                if rep >= 0:
                    times[i, j, rep] = elapsed
    return times


def measure(
    comm: Communicator, sizes_mib: Sequence[float], algorithms: Sequence[AllreduceAlgorithm], reps: int, warmup: int
) -> tuple[list[str], np.ndarray]:
    """:func:`measure_bytes` in MiB, with the library's ``MPI_Allreduce``
    first; returns (names, seconds [impl, size, rep])."""
    times = measure_bytes(comm, [int(mib * MIB) for mib in sizes_mib], algorithms, reps, warmup, library_column=True)
    return ["MPI_Allreduce", *algorithms], times


def _table(names, sizes_mib, times):
    median = np.median(times, axis=2)
    bandwidth = np.array(sizes_mib)[None, :] * MIB / median / 1e9
    head = f"{'size MiB':>8} " + " ".join(f"{n:>18}" for n in names)
    lines = [f"algorithmic bandwidth, GB/s (median); ratio to {names[0]}", head]
    for j, mib in enumerate(sizes_mib):
        cells = [f"{bandwidth[0, j]:18.3f}"] + [
            f"{bandwidth[i, j]:10.3f} ({bandwidth[i, j] / bandwidth[0, j]:4.2f}x)" for i in range(1, len(names))
        ]
        lines.append(f"{mib:8g} " + " ".join(cells))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog=".venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py -m collectives.bench allreduce",
        description="Allreduce bandwidth of our schedules and of MPI_Allreduce in the same run (float32, in place).",
    )
    parser.add_argument("--sizes-mib", default="1,2,4,8,16,32,64", help="comma-separated buffer sizes in MiB")
    parser.add_argument(
        "--algorithms",
        default=",".join([*ALLREDUCE_ALGORITHMS, "auto"]),
        help="comma-separated, from: "
        + ", ".join(CHOICES)
        + " (mpi: the library's Allreduce through our call; auto: the tuning "
        "table's choice, docs/mpi.md)",
    )
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--out", default=None, help="HDF5 file (default results/allreduce/allreduce_n{ranks}.h5)")
    args = parser.parse_args(argv)
    sizes = [float(s) for s in args.sizes_mib.split(",")]
    algorithms = args.algorithms.split(",")
    unknown = [a for a in algorithms if a not in CHOICES]
    if unknown or args.reps < 1 or args.warmup < 0 or min(sizes) <= 0:
        parser.error(
            f"--algorithms must be from {', '.join(CHOICES)} (got {unknown})"
            if unknown
            else "--reps >= 1, --warmup >= 0 and positive --sizes-mib needed"
        )
    with Communicator(MPI.COMM_WORLD) as comm:
        attrs = run_attributes(comm.data)
        names, times = measure(comm, sizes, algorithms, args.reps, args.warmup)
        tuning = comm.tuning.source if comm.tuning else "none (fixed thresholds)"  # collective
        if comm.rank == 0:
            print(
                f"allreduce on {comm.size} ranks, {os.cpu_count()} cores, "
                f"{attrs['mpi_library']}; auto's tuning table: {tuning}"
            )
            print(_table(names, sizes, times))
            with results_file(args.out, os.path.join("allreduce", f"allreduce_n{comm.size}.h5"), attrs) as f:
                f.attrs.update(
                    dtype="float32",
                    reps=args.reps,
                    tuning_table=tuning,
                    check=False,
                    warmup=args.warmup,
                    timing="max over ranks, barrier to return, seconds",
                )
                f["sizes_bytes"] = np.array(sizes) * MIB
                f["implementations"] = np.array(names, dtype="S")
                f["seconds"] = times
                f["seconds"].attrs["axes"] = "implementation, size, repetition"
