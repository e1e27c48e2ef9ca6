"""Ping-pong of every pair of ranks at once: the latency and bandwidth of a message at P ranks on this node.

``.venv/bin/mpiexec -n P .venv/bin/python -m mpi4py -m collectives.bench pingpong [--waits spin|yield] [--mib 1]``

The pairs (r, r xor 1) exchange at the same time, as every rank does in a
round of a butterfly allreduce, and wait the way the runtime's collectives
do: ``spin`` in ``MPI_Waitall`` (the blocking and background allreduces),
``yield`` testing with a back-off (progress threads, and everything on an
oversubscribed node that asks for it).  Rank 2i sends, rank 2i + 1 returns
the message; a repetition starts on every rank after a barrier.

alpha = half the round trip of an 8-byte message; beta = (half the round
trip of ``--mib`` MiB - alpha) / bytes; each the median over the pairs and
repetitions.  On a machine with a core per rank these are the network's (or
shared memory's); with more ranks than cores they include the time a woken
rank waits for a core, which is what a message costs a run there.  These
are the alpha and beta with which the simulator is validated against
measured runs (``experiments.validate_sim``, :class:`wagma.sim.network.Network`).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import numpy as np
from mpi4py import MPI

from ..comm import Communicator
from ..provenance import results_file, run_attributes

__all__ = ["half_round_trips", "main"]

_TAG = 43


def half_round_trips(comm: Communicator, nbytes: int, reps: int, warmup: int) -> np.ndarray:
    """Seconds of half a round trip of ``nbytes`` for each repetition,
    measured on the even rank of each pair (NaN on odd ranks and on a last
    rank without a partner)."""
    peer = comm.rank ^ 1
    message = np.zeros(max(nbytes, 1), dtype=np.uint8)
    times = np.full(reps, np.nan)
    for rep in range(warmup + reps):
        comm.data.Barrier()
        if peer >= comm.size:
            continue
        start = time.perf_counter()
        if comm.rank % 2 == 0:
            comm.wait_all([comm.data.Isend(message, peer, _TAG)])
            comm.wait_all([comm.data.Irecv(message, peer, _TAG)])
            if rep >= warmup:
                times[rep - warmup] = (time.perf_counter() - start) / 2
        else:
            comm.wait_all([comm.data.Irecv(message, peer, _TAG)])
            comm.wait_all([comm.data.Isend(message, peer, _TAG)])
    return times


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=".venv/bin/mpiexec -n 8 .venv/bin/python -m mpi4py -m collectives.bench pingpong",
        description="Every pair of ranks ping-pongs at once: alpha and beta at P ranks on this node.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--waits", choices=("spin", "yield"), default="spin", help="how a rank waits for its message (see the module)"
    )
    parser.add_argument("--mib", type=float, default=1.0, help="the large message, MiB (for beta)")
    parser.add_argument("--reps", type=int, default=50, help="timed repetitions per size")
    parser.add_argument("--warmup", type=int, default=5, help="untimed repetitions first")
    parser.add_argument("--out", default=None, help="HDF5 file [results/pingpong/pingpong_pP_WAITS.h5]")
    args = parser.parse_args(argv)
    world = MPI.COMM_WORLD
    if args.mib <= 0 or args.reps < 1 or args.warmup < 0:
        parser.error(f"--mib must be > 0, --reps >= 1 and --warmup >= 0, got {args.mib}, {args.reps} and {args.warmup}")
    if world.size < 2:
        parser.error(f"pingpong needs at least 2 ranks, got {world.size}")
    nbytes = int(args.mib * 2**20)
    with Communicator(world, yield_while_waiting=args.waits == "yield") as comm:
        attrs = run_attributes(comm.data)
        small = half_round_trips(comm, 8, args.reps, args.warmup)
        large = half_round_trips(comm, nbytes, args.reps, args.warmup)
        small, large = np.concatenate(world.allgather(small)), np.concatenate(world.allgather(large))
    alpha = float(np.nanmedian(small))
    beta = max(float(np.nanmedian(large)) - alpha, 0.0) / nbytes
    if world.rank == 0:
        print(f"| P | cores | waits | alpha (us) | 1/beta (GB/s) | {args.mib:g} MiB half round trip (ms) |")
        print("|---:|---:|---|---:|---:|---:|")
        print(
            f"| {world.size} | {attrs['cores_per_host']} | {args.waits} | {alpha * 1e6:.1f} | "
            f"{(1 / beta / 1e9) if beta else float('inf'):.2f} | {np.nanmedian(large) * 1e3:.2f} |"
        )
        attrs.update(
            waits=args.waits,
            alpha_s=alpha,
            beta_s_per_byte=beta,
            large_bytes=nbytes,
            reps=args.reps,
            warmup=args.warmup,
        )
        with results_file(args.out, f"pingpong/pingpong_p{world.size}_{args.waits}.h5", attrs) as f:
            f["half_round_trip_small_s"] = small
            f["half_round_trip_large_s"] = large
    return 0
