"""The activation hop of the wait-avoiding group allreduce, against the library's alpha.

``.venv/bin/python -m experiments.mpirun -n P -- .venv/bin/python -m mpi4py -m collectives.bench hop
[--compute sleep|busy]``

An activation reaches a rank as a control message that its progress thread
notices; the hop is the time from one rank's activation to the next rank's
start of execution, one level of the binomial tree.  Each repetition: every
rank computes for ``--idle-ms`` (its progress thread idle meanwhile, as
during a training step), then rank 0 arrives and activates version t while
the others compute ``--late-ms`` more and arrive after t has begun on them
(stale).  Each rank records when t began executing on it
(:attr:`~collectives.wait_avoiding.collective.WaitAvoidingGroupAllreduce.began`,
``time.perf_counter()``, one clock on a node); the delay of rank r is that
time minus rank 0's arrival, and r is ``popcount(r)`` levels below rank 0
in its tree (:class:`~collectives.wait_avoiding.activation.ActivationState`).

``--compute sleep`` leaves the cores to the progress threads (the main
threads sleep); ``busy`` keeps them busy with matrix products (which
release the GIL, as a framework's kernels do), so that on a node with
fewer cores than threads a woken progress thread also waits for a core.
alpha is half the round trip of an 8-byte message between pairs of ranks
spinning in ``MPI_Waitall`` (:func:`~collectives.bench.pingpong.half_round_trips`),
measured in the same job before the repetitions.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence

import numpy as np
from mpi4py import MPI

from ..comm import Communicator
from ..provenance import results_file, run_attributes
from ..wait_avoiding.collective import WaitAvoidingGroupAllreduce
from ..wait_avoiding.progress import IDLE_POLICIES, Idle
from .pingpong import half_round_trips

__all__ = ["activation_delays", "main"]


def _compute(seconds: float, busy: bool, work: np.ndarray) -> None:
    """Sleep, or multiply matrices, for ``seconds``."""
    if not busy:
        time.sleep(seconds)
        return
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        np.matmul(work, work, out=work)
        work *= 1e-3  # keep the values finite


def activation_delays(
    world: MPI.Intracomm, reps: int, idle_s: float, late_s: float, busy: bool, idle: Idle
) -> np.ndarray:
    """``[reps]`` seconds from rank 0's arrival at version t to t's start of
    execution on this rank (0 on rank 0, which executes it itself), with
    progress threads that wait as ``idle`` says."""
    work = np.eye(96)
    buf = np.zeros(16)
    arrivals = np.zeros(reps)
    with WaitAvoidingGroupAllreduce(world, buf, group_size=world.size, tau=reps + 1, history=reps, idle=idle) as wa:
        for t in range(reps):
            world.Barrier()
            _compute(idle_s, busy, work)
            if world.rank == 0:
                arrivals[t] = time.perf_counter()
            else:
                _compute(late_s, busy, work)
            buf = wa.allreduce(buf, t).value
        began = dict(wa.began)
    arrivals = world.bcast(arrivals)
    return np.array([began[t] - arrivals[t] for t in range(reps)])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=".venv/bin/python -m experiments.mpirun -n 8 -- .venv/bin/python -m mpi4py -m collectives.bench hop",
        description="The activation hop of the wait-avoiding group allreduce against the library's alpha.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--compute",
        choices=("sleep", "busy"),
        default="sleep",
        help="what the main threads do while idle (see the module)",
    )
    parser.add_argument(
        "--idle", default="backoff,park", help="the progress threads' idle policies, one run each, comma-separated"
    )
    parser.add_argument("--reps", type=int, default=40, help="activations timed")
    parser.add_argument("--idle-ms", type=float, default=50.0, help="compute before rank 0 arrives")
    parser.add_argument("--late-ms", type=float, default=50.0, help="the others' compute after it")
    parser.add_argument("--out", default=None, help="HDF5 file [results/hop/hop_pP_COMPUTE.h5]")
    args = parser.parse_args(argv)
    world = MPI.COMM_WORLD
    if args.reps < 1 or args.idle_ms < 0 or args.late_ms <= 0:
        parser.error(
            f"--reps must be >= 1, --idle-ms >= 0 and --late-ms > 0, got {args.reps}, {args.idle_ms} and {args.late_ms}"
        )
    if world.size < 2:
        parser.error(f"hop needs at least 2 ranks, got {world.size}")
    policies = args.idle.split(",")
    if not policies or any(policy not in IDLE_POLICIES for policy in policies):
        parser.error(f"--idle must be policies of {', '.join(IDLE_POLICIES)} separated by commas, got {args.idle!r}")
    with Communicator(world) as comm:
        attrs = run_attributes(comm.data)
        alpha = float(np.nanmedian(np.concatenate(world.allgather(half_round_trips(comm, 8, 50, 5)))))
    busy = args.compute == "busy"
    delays = {
        policy: np.array(
            world.gather(activation_delays(world, args.reps, args.idle_ms / 1e3, args.late_ms / 1e3, busy, policy))
        )
        for policy in policies
    }
    if world.rank != 0:
        return 0
    levels = np.array([bin(r).count("1") for r in range(world.size)])
    cores = os.cpu_count()
    depth = int(levels.max())
    print(f"Activation delay from rank 0's arrival (medians of {args.reps}), P = {world.size}, {cores} cores")
    print(
        "| P | cores | compute | idle | alpha (us) | "
        + " | ".join(f"level {k} (ms)" for k in range(1, depth + 1))
        + " | per hop (ms) | hop / alpha |"
    )
    print("|---:|---:|---|---|---:|" + "---:|" * (depth + 2))
    per_hop = {}
    for policy, delay in delays.items():
        per_level = [float(np.median(delay[levels == level])) for level in range(1, depth + 1)]
        per_hop[policy] = float(np.median(delay[levels > 0] / levels[levels > 0, None]))
        print(
            f"| {world.size} | {cores} | {args.compute} | {policy} | {alpha * 1e6:.1f} | "
            + " | ".join(f"{d * 1e3:.3f}" for d in per_level)
            + f" | {per_hop[policy] * 1e3:.3f} | {per_hop[policy] / alpha:.1f} |"
        )
    attrs.update(
        compute=args.compute,
        reps=args.reps,
        idle_s=args.idle_ms / 1e3,
        late_s=args.late_ms / 1e3,
        alpha_s=alpha,
        cores=cores,
        policies=",".join(policies),
    )
    with results_file(args.out, f"hop/hop_p{world.size}_{args.compute}.h5", attrs) as f:
        f["level"] = levels
        for policy, delay in delays.items():
            f[f"delay_s/{policy}"] = delay
            f[f"delay_s/{policy}"].attrs["per_hop_s"] = per_hop[policy]
    return 0
