"""Allreduce time: our schedules, and ``auto``, against the MPI library's Allreduce.

Each implementation is a call on one float32 buffer per size, taking turns
with the others within every repetition:

* ``MPI_Allreduce``: the library's own call, ``comm.Allreduce(IN_PLACE, x, SUM)``;
* ``ring``, ``rhd``, ``recursive_doubling``, ``mpi``: ``allreduce(x,
  algorithm=NAME, check=False)``; the argument check (one small allreduce on
  the control channel) costs the same whichever schedule runs, and the
  library's own call has none, so these columns compare the schedules;
* ``auto``: :func:`~collectives.schedules.blocking.allreduce_init` on ``x``,
  then its calls: what a training loop runs, arguments checked and ``auto``
  resolved once per buffer;
* ``auto_checked``: ``allreduce(x)``, checked and resolved on every call.

A repetition times :func:`calls_per_repetition` back-to-back calls (so
that a 4 KiB call is not lost in the barrier's jitter) and records the time
per call.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from functools import partial
from typing import cast

import numpy as np
from mpi4py import MPI

from ..comm import Communicator
from ..provenance import results_file, run_attributes
from ..schedules.blocking import (
    ALLREDUCE_ALGORITHMS,
    ALLREDUCE_CHOICES,
    AllreduceChoice,
    allreduce,
    allreduce_init,
)

__all__ = [
    "BYTES_PER_REPETITION",
    "CHOICES",
    "MAX_CALLS_PER_REPETITION",
    "calls_per_repetition",
    "main",
    "measure_bytes",
    "parse_sizes",
    "size_label",
]

KIB = 1 << 10
MIB = 1 << 20
#: What ``--algorithms`` accepts: our schedules, "mpi" (the library's
#: Allreduce through our call), "auto" (persistent) and "auto_checked".
CHOICES = (*ALLREDUCE_CHOICES, "auto", "auto_checked")
#: A repetition's calls move about this many bytes in all, in at most
#: :data:`MAX_CALLS_PER_REPETITION` calls: several calls up to 4 MiB, so that
#: one descheduled call on ranks that share cores does not decide a median.
BYTES_PER_REPETITION = 16 * MIB
#: The most calls one repetition times (4 KiB and below).
MAX_CALLS_PER_REPETITION = 1024


def parse_sizes(text: str) -> list[int]:
    """``4KiB:256MiB`` (every power of 4 from the first to the second) or a
    comma-separated list, each size in bytes or with KiB, MiB or GiB."""
    units = {"KiB": KIB, "MiB": MIB, "GiB": KIB * MIB, "": 1}

    def parse(word):
        for unit in sorted(units, key=len, reverse=True):
            if word.endswith(unit) and word[: len(word) - len(unit)].isdigit():
                return int(word[: len(word) - len(unit)]) * units[unit]
        raise ValueError(word)

    if ":" in text:
        lo, hi = map(parse, text.split(":"))
        sizes = []
        while lo <= hi:
            sizes.append(lo)
            lo *= 4
        return sizes
    return [parse(word) for word in text.split(",")]


def calls_per_repetition(nbytes: int) -> int:
    """How many calls one repetition times: 1024 at 4 KiB, 16 at 1 MiB, 1 from 16 MiB on."""
    return min(MAX_CALLS_PER_REPETITION, max(1, BYTES_PER_REPETITION // max(int(nbytes), 1)))


def _implementation(name: str, x: np.ndarray, comm: Communicator) -> Callable[[], object]:
    """A call of ``name`` (``MPI_Allreduce`` or one of :data:`CHOICES`) on ``x``."""
    if name == "MPI_Allreduce":
        return partial(comm.data.Allreduce, MPI.IN_PLACE, x, MPI.SUM)
    if name == "auto":
        return allreduce_init(x, comm=comm)
    if name == "auto_checked":
        return partial(allreduce, x, comm=comm)
    return partial(allreduce, x, comm=comm, algorithm=cast(AllreduceChoice, name), check=False)


def measure_bytes(
    comm: Communicator,
    sizes_bytes: Sequence[int],
    algorithms: Sequence[str],
    reps: int,
    warmup: int,
    library_column: bool = False,
) -> np.ndarray:
    """Time each of ``algorithms`` (from :data:`CHOICES`) on float32 buffers
    of ``sizes_bytes``; returns seconds per call [impl, size, rep], the first
    impl the library's plain ``MPI_Allreduce`` when ``library_column``.

    A repetition is timed from a barrier to the slowest rank's return from
    its :func:`calls_per_repetition` calls (the maximum over ranks).
    Implementations take turns within each repetition, so drift in the
    machine's load affects all of them alike.
    """
    names = (["MPI_Allreduce"] if library_column else []) + list(algorithms)
    times = np.zeros((len(names), len(sizes_bytes), reps))
    for j, nbytes in enumerate(sizes_bytes):
        # Zeros stay finite however often they are summed in place.
        x = np.zeros(int(nbytes) // 4, dtype=np.float32)
        runs = [_implementation(name, x, comm) for name in names]
        calls = calls_per_repetition(nbytes)
        for rep in range(-warmup, reps):
            for i, run in enumerate(runs):
                comm.data.Barrier()
                start = MPI.Wtime()
                for _ in range(calls):
                    run()
                elapsed = comm.data.allreduce((MPI.Wtime() - start) / calls, op=MPI.MAX)
                if rep >= 0:
                    times[i, j, rep] = elapsed
    return times


def size_label(nbytes: int) -> str:
    """``4 KiB``, ``256 MiB``."""
    return f"{nbytes / KIB:g} KiB" if nbytes < MIB else f"{nbytes / MIB:g} MiB"


def _table(names, sizes, times):
    median = np.median(times, axis=2)
    head = f"{'size':>9} " + " ".join(f"{n:>22}" for n in names)
    lines = [f"microseconds per call (median, max over ranks); (speed relative to {names[0]})", head]
    for j, nbytes in enumerate(sizes):
        cells = [f"{median[0, j] * 1e6:22.1f}"] + [
            f"{median[i, j] * 1e6:14.1f} ({median[0, j] / median[i, j]:4.2f}x)" for i in range(1, len(names))
        ]
        lines.append(f"{size_label(nbytes):>9} " + " ".join(cells))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog=".venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py -m collectives.bench allreduce",
        description="Allreduce time of our schedules and of MPI_Allreduce in the same run (float32, in place).",
    )
    parser.add_argument(
        "--sizes",
        default="1MiB:64MiB",
        help="LO:HI (every power of 4 from LO to HI) or comma-separated sizes, with KiB/MiB/GiB or in bytes",
    )
    parser.add_argument(
        "--algorithms",
        default=",".join([*ALLREDUCE_ALGORITHMS, "auto"]),
        help="comma-separated, from: "
        + ", ".join(CHOICES)
        + " (mpi: the library's Allreduce through our call; auto: allreduce_init's persistent allreduce, "
        "checked and resolved once; auto_checked: allreduce(x) checked on every call; docs/mpi.md)",
    )
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--out", default=None, help="HDF5 file (default results/allreduce/allreduce_n{ranks}.h5)")
    args = parser.parse_args(argv)
    try:
        sizes = parse_sizes(args.sizes)
    except ValueError as exc:
        parser.error(f"--sizes: cannot read {exc} (e.g. 4KiB:256MiB or 4096,65536)")
    algorithms = args.algorithms.split(",")
    unknown = [a for a in algorithms if a not in CHOICES]
    if unknown or args.reps < 1 or args.warmup < 0 or not sizes or min(sizes) < 4:
        parser.error(
            f"--algorithms must be from {', '.join(CHOICES)} (got {unknown})"
            if unknown
            else "--reps >= 1, --warmup >= 0 and --sizes of 4 bytes or more needed"
        )
    with Communicator(MPI.COMM_WORLD) as comm:
        attrs = run_attributes(comm.data)
        times = measure_bytes(comm, sizes, algorithms, args.reps, args.warmup, library_column=True)
        names = ["MPI_Allreduce", *algorithms]
        tuning = comm.tuning.source if comm.tuning else "none (the library's MPI_Allreduce)"  # collective
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
                    timing="max over ranks of the mean over a repetition's calls, barrier to return, seconds",
                )
                f["sizes_bytes"] = np.array(sizes)
                f["calls_per_repetition"] = np.array([calls_per_repetition(n) for n in sizes])
                f["implementations"] = np.array(names, dtype="S")
                f["seconds"] = times
                f["seconds"].attrs["axes"] = "implementation, size, repetition"
