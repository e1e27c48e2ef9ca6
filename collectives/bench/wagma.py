"""Wait-avoiding group allreduce against the blocking group allreduce and a global Allreduce."""

import argparse
import os
import resource
import time

import numpy as np
from mpi4py import MPI

from ..comm import Communicator
from ..group_allreduce import group_allreduce
from ..wait_avoiding import WAITS, WaitAvoidingGroupAllreduce, resolve_waits
from .provenance import results_file, run_attributes

__all__ = ["main"]

MIB = 1 << 20
SCENARIOS = ("none", "random2", "straggler")
IMPLEMENTATIONS = ("wait_avoiding", "group_blocking", "global_allreduce")


def delayed_ranks(scenario, size, iterations, seed):
    """``[step, rank]`` booleans: who sleeps the delay before entering.

    Drawn from ``seed`` alone, so every rank computes the same table:
    ``random2`` delays two random ranks per step (the WAGMA paper's set-up),
    ``straggler`` delays the last rank at every step.
    """
    table = np.zeros((iterations, size), dtype=bool)
    if scenario == "random2":
        rng = np.random.default_rng(seed)
        for step in range(iterations):
            table[step, rng.choice(size, min(2, size), replace=False)] = True
    elif scenario == "straggler":
        table[:, size - 1] = True
    return table


def round_bounds(iterations, rounds):
    """``[(first, end)]`` steps of each round: ``iterations`` split into
    ``rounds`` consecutive, nearly equal runs."""
    edges = np.linspace(0, iterations, rounds + 1).round().astype(int)
    return list(zip(edges[:-1].tolist(), edges[1:].tolist()))


def kept_steps(bounds, warmup):
    """Steps in the statistics: all but the first ``warmup`` of each round."""
    kept = np.zeros(bounds[-1][1], dtype=bool)
    for first, end in bounds:
        kept[first + warmup:end] = True
    return kept


def round_order(round_index):
    """The implementations in the order round ``round_index`` runs them.

    Rotated by one each round, so none always runs first or last, and every
    second cycle of rotations reversed, so none always runs right after the
    same other one: over 6 rounds each runs twice in each turn and follows
    each other one equally often (MPI_Allreduce leaves the machine slower
    for the tens of steps after it at 8 ranks on 2 cores).
    """
    count = len(IMPLEMENTATIONS)
    cycle = IMPLEMENTATIONS if (round_index // count) % 2 == 0 else IMPLEMENTATIONS[::-1]
    shift = round_index % count
    return cycle[shift:] + cycle[:shift]


def _run(implementation, comm, buf, group_size, delays, delay_s, waits, first):
    """Steps ``first, first + 1, ...`` of one implementation (``delays``:
    their rows of the delay table).  Seconds per step on this rank (the
    injected delay plus the collective), and whether this rank's contribution
    was fresh at each step.  The wait-avoiding and the blocking group
    allreduce wait for transfers the same way (``waits``; ``comm`` is set up
    so) and use the groups of the same iterations.  The wait-avoiding
    collective is opened for the round and closed after it (untimed), so its
    progress thread does not run while the others are timed."""
    steps = np.zeros(len(delays))
    fresh = np.ones(len(delays), dtype=bool)
    wa = None
    if implementation == "wait_avoiding":
        wa = WaitAvoidingGroupAllreduce(comm.data, buf, group_size=group_size,
                                        op="avg", waits=waits,
                                        first_iteration=first).open()
    comm.data.Barrier()
    for i, delayed in enumerate(delays[:, comm.rank]):
        t = first + i
        start = time.perf_counter()
        if delayed:
            time.sleep(delay_s)
        if wa is not None:
            result = wa.allreduce(buf, t)     # buf is lent; the model moves to value
            fresh[i] = result.fresh
            if not result.fresh:
                combine_stale(result.value, buf, group_size)
            buf = result.value
        elif implementation == "group_blocking":
            group_allreduce(buf, comm=comm, group_size=group_size, t=t, op="avg",
                            check=False)
        else:
            comm.data.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
            buf *= 1.0 / comm.size
        steps[i] = time.perf_counter() - start
    if wa is not None:
        wa.close()
    return steps, fresh


def combine_stale(mean, contribution, group_size, chunk=1 << 16):
    """WAGMA Algorithm 2, line 13, in ``mean``: W_{t+1} = (S * mean + W'_t) / (S + 1).

    Chunk by chunk, so the scaled contribution is a temporary that stays in
    cache (numpy has no fused a * x + y).
    """
    scaled = np.empty(min(chunk, mean.size), dtype=mean.dtype)
    for lo in range(0, mean.size, chunk):
        out, part = mean[lo:lo + chunk], scaled[:min(chunk, mean.size - lo)]
        np.multiply(contribution[lo:lo + chunk], 1.0 / (group_size + 1), out=part)
        out *= group_size / (group_size + 1)
        out += part


def idle_progress_cpu(comm, buf, group_size, seconds):
    """Share of one core that this process uses while its progress thread idles."""
    with WaitAvoidingGroupAllreduce(comm.data, buf, group_size=group_size):
        before = resource.getrusage(resource.RUSAGE_SELF)
        wall = time.perf_counter()
        time.sleep(seconds)
        after = resource.getrusage(resource.RUSAGE_SELF)
        wall = time.perf_counter() - wall
    used = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return used / wall


def default_group_size(size):
    """The paper's S ~ sqrt(P), as a power of two: 2**ceil(log2(P) / 2)."""
    return 1 << (((size.bit_length() - 1) + 1) // 2)


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m collectives.bench wagma",
        description="Time per iteration of the wait-avoiding group allreduce, the "
                    "blocking group allreduce and MPI_Allreduce under injected delays.")
    parser.add_argument("--size-mib", type=float, default=16.0)
    parser.add_argument("--group-size", type=int, default=None,
                        help="S (default 2**ceil(log2(P)/2), the paper's ~sqrt(P))")
    parser.add_argument("--iterations", type=int, default=180,
                        help="steps per implementation and scenario")
    parser.add_argument("--rounds", type=int, default=6,
                        help="the steps are run in this many rounds, the implementations "
                             "taking turns within each (so drift in the machine's load "
                             "reaches all of them alike)")
    parser.add_argument("--warmup", type=int, default=10,
                        help="first steps of each round left out of the statistics (the "
                             "wait-avoiding collective is opened anew each round: its "
                             "first steps allocate buffers and start a thread)")
    parser.add_argument("--delay-ms", type=float, default=50.0)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS),
                        help="comma-separated, from: " + ", ".join(SCENARIOS))
    parser.add_argument("--idle-seconds", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--waits", choices=WAITS, default="auto",
                        help="how the two group allreduces wait for transfers: spin "
                             "(MPI_Waitall), yield (test with a back-off), auto (yield "
                             "when the node has more ranks than cores)")
    parser.add_argument("--out", default=None,
                        help="HDF5 file (default results/wagma_n{ranks}.h5)")
    args = parser.parse_args(argv)
    scenarios = args.scenarios.split(",")
    if any(s not in SCENARIOS for s in scenarios):
        parser.error(f"--scenarios must be from {', '.join(SCENARIOS)}, got {args.scenarios}")
    if not 1 <= args.rounds <= args.iterations:
        parser.error(f"--rounds must be in 1..--iterations ({args.iterations}), "
                     f"got {args.rounds}")
    bounds = round_bounds(args.iterations, args.rounds)
    shortest = min(end - first for first, end in bounds)
    if not 0 <= args.warmup < shortest:
        parser.error(f"--warmup must be in 0..{shortest - 1} (the shortest round has "
                     f"{shortest} steps), got {args.warmup}")
    if args.delay_ms < 0 or args.size_mib <= 0:
        parser.error("--delay-ms >= 0 and --size-mib > 0 needed")
    waits = resolve_waits(args.waits, MPI.COMM_WORLD)
    with Communicator(MPI.COMM_WORLD, yield_while_waiting=waits == "yield") as comm:
        group_size = args.group_size or default_group_size(comm.size)
        attrs = run_attributes(comm.data)
        buf = np.zeros(int(args.size_mib * MIB) // 4, dtype=np.float32)
        steps = {}
        for scenario in scenarios:
            delays = delayed_ranks(scenario, comm.size, args.iterations, args.seed)
            seconds = {i: np.zeros(args.iterations) for i in IMPLEMENTATIONS}
            fresh = {i: np.ones(args.iterations, dtype=bool) for i in IMPLEMENTATIONS}
            for r, (first, end) in enumerate(bounds):
                for implementation in round_order(r):
                    seconds[implementation][first:end], fresh[implementation][first:end] = _run(
                        implementation, comm, buf, group_size, delays[first:end],
                        args.delay_ms / 1e3, waits, first)
            for implementation in IMPLEMENTATIONS:
                steps[scenario, implementation] = (
                    np.array(comm.data.gather(seconds[implementation])), delays,
                    np.array(comm.data.gather(fresh[implementation])))
        idle = comm.data.gather(idle_progress_cpu(comm, buf, group_size, args.idle_seconds))
        if comm.rank == 0:
            _report(comm.size, group_size, args, attrs, steps, idle, waits, bounds)


def _fast_ms(seconds, delays, kept):
    """Mean step time over the (rank, step) pairs of the ``kept`` steps whose
    rank was not delayed, in ms."""
    fast = ~delays[kept]
    if not fast.any():
        return float("nan")
    return float(seconds[:, kept].T[fast].mean() * 1e3)


def round_fast_ms(seconds, delays, bounds, warmup):
    """:func:`_fast_ms` of each round alone (its steps after the warm-up), in ms.

    The implementations run the same round back to back, so a ratio of two
    of them within one round compares them under the same machine load;
    the spread of those ratios over the rounds is the run's own measure of
    how far its overall ratio can be trusted.
    """
    steps = np.arange(seconds.shape[1])
    return np.array([_fast_ms(seconds, delays, (steps >= first + warmup) & (steps < end))
                     for first, end in bounds])


def ratio_spread(numerator, denominator):
    """``(median, min, max)`` over the rounds of ``numerator / denominator``
    (per-round arrays), NaN where no round has both."""
    ratios = numerator / denominator
    ratios = ratios[np.isfinite(ratios)]
    if not len(ratios):
        return (float("nan"),) * 3
    return float(np.median(ratios)), float(ratios.min()), float(ratios.max())


def _spread(stats):
    median, low, high = stats
    return "-" if np.isnan(median) else f"{median:.2f} [{low:.2f}, {high:.2f}]"


def _report(size, group_size, args, attrs, steps, idle, waits, bounds):
    kept = kept_steps(bounds, args.warmup)
    per_round = {key: round_fast_ms(seconds, delays, bounds, args.warmup)
                 for key, (seconds, delays, _) in steps.items()}
    print(f"wait-avoiding group allreduce: {size} ranks, {os.cpu_count()} cores, "
          f"{args.size_mib:g} MiB float32, S={group_size}, no sync steps, "
          f"{args.iterations} iterations in {args.rounds} interleaved rounds, delay "
          f"{args.delay_ms:g} ms, group allreduces' "
          f"waits {waits}; {attrs['mpi_library']}")
    print(f"ms per iteration on the ranks not delayed in that step (mean over ranks and "
          f"steps, first {args.warmup} steps of each round left out); "
          f"'-': every rank delayed")
    print(f"{'scenario':>10} " + " ".join(f"{i:>18}" for i in IMPLEMENTATIONS)
          + "   WA/blocking  global/WA  WA fresh")
    for scenario in dict.fromkeys(s for s, _ in steps):
        ms = [_fast_ms(*steps[scenario, i][:2], kept) for i in IMPLEMENTATIONS]
        fresh = steps[scenario, "wait_avoiding"][2][:, kept].mean()
        print((f"{scenario:>10} " + " ".join(f"{m:18.2f}" for m in ms)
               + f"   {ms[0] / ms[1]:11.2f}  {ms[2] / ms[0]:9.2f}  {fresh:8.0%}"
               ).replace("nan", "  -"))
    print(f"the same ratios round by round (median [min, max] over the {args.rounds} "
          f"rounds; each round runs the implementations back to back):")
    for scenario in dict.fromkeys(s for s, _ in steps):
        wa, blocking, mpi = (per_round[scenario, i] for i in IMPLEMENTATIONS)
        print(f"{scenario:>10}   WA/blocking {_spread(ratio_spread(wa, blocking))}"
              f"   global/WA {_spread(ratio_spread(mpi, wa))}")
    print(f"idle progress thread: {max(idle) * 100:.2f}% of a core "
          f"(largest over ranks, {args.idle_seconds:g} s idle)")
    with results_file(args.out, f"wagma_n{size}.h5", attrs) as f:
        f.attrs.update(size_bytes=int(args.size_mib * MIB), group_size=group_size,
                       iterations=args.iterations, rounds=args.rounds,
                       warmup_per_round=args.warmup,
                       delay_ms=args.delay_ms,
                       seed=args.seed, sync_steps="none", dtype="float32",
                       waits=waits)
        f["idle_progress_cpu_fraction"] = np.array(idle)
        f["kept_steps"] = kept
        f["kept_steps"].attrs["axes"] = "step (in the statistics: not a round's warm-up)"
        f["round_order"] = np.array([[IMPLEMENTATIONS.index(i) for i in round_order(r)]
                                     for r in range(args.rounds)])
        f["round_order"].attrs["axes"] = ("round, turn (index into the implementations "
                                          "attribute)")
        f.attrs["implementations"] = ",".join(IMPLEMENTATIONS)
        for (scenario, implementation), (seconds, delays, fresh) in steps.items():
            g = f.require_group(scenario)
            g[implementation] = seconds
            g[implementation].attrs["axes"] = "rank, step (seconds: delay + collective)"
            g[implementation].attrs["fast_rank_ms_per_iteration"] = _fast_ms(
                seconds, delays, kept)
            g[implementation].attrs["fast_rank_ms_per_round"] = per_round[
                scenario, implementation]
            if implementation == "wait_avoiding":
                g["wait_avoiding_fresh"] = fresh
                g["wait_avoiding_fresh"].attrs["axes"] = "rank, step"
            if "delayed" not in g:
                g["delayed"] = delays
                g["delayed"].attrs["axes"] = "step, rank"
