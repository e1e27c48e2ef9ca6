"""``python -m collectives.bench NAME [options]``: run one benchmark."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from ..logs import configure_logging
from . import allreduce, hop, pingpong, plans, stragglar, tune, wagma

__all__ = ["BENCHMARKS", "main"]

BENCHMARKS: dict[str, tuple[Callable[[Sequence[str] | None], int | None], str]] = {
    "allreduce": (allreduce.main, "allreduce bandwidth: our schedules against MPI_Allreduce"),
    "hop": (hop.main, "the wait-avoiding collective's activation hop per tree level against the library's alpha"),
    "plans": (plans.main, "StragglAR plans at n ranks: generated on every rank against shared from one"),
    "pingpong": (pingpong.main, "every pair of ranks ping-pongs at once: alpha and beta at P ranks on this node"),
    "stragglar": (stragglar.main, "StragglAR against ring, RHD and MPI_Allreduce with a delayed rank"),
    "tune": (tune.main, "the allreduce tuning table: which allreduce is fastest at each size (auto reads it)"),
    "wagma": (wagma.main, "the wait-avoiding group allreduce against its blocking twin and MPI_Allreduce"),
}


def main(argv: Sequence[str] | None = None) -> int | None:
    parser = argparse.ArgumentParser(
        prog=".venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py -m collectives.bench",
        description="Run one benchmark; it prints its table and writes an HDF5 file.",
        epilog="benchmarks:\n"
        + "\n".join(f"  {name:10s} {text}" for name, (_, text) in BENCHMARKS.items())
        + "\n\n'BENCHMARK --help' lists a benchmark's own options, for example:\n"
        "  .venv/bin/python -m collectives.bench allreduce --help",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("benchmark", choices=BENCHMARKS, help="which benchmark")
    parser.add_argument("options", nargs=argparse.REMAINDER, help="the benchmark's own options")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    configure_logging()
    return BENCHMARKS[args.benchmark][0](args.options)


if __name__ == "__main__":
    sys.exit(main())
