"""Wait-avoiding group allreduce against the blocking group allreduce and a global Allreduce."""

from __future__ import annotations

import argparse
import os
import resource
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np
from mpi4py import MPI

from ..comm import Communicator
from ..provenance import results_file, run_attributes
from ..wait_avoiding import WAITS, WaitAvoidingGroupAllreduce, resolve_waits
from ..wait_avoiding.group_allreduce import GROUP_ALLREDUCE_CHOICES, group_allreduce
from ..wait_avoiding.group_library import GroupCommunicators
from ..wait_avoiding.groups import ButterflyGrouping
from ..wait_avoiding.persistent_group import group_allreduce_init

__all__ = ["main"]

MIB = 1 << 20
SCENARIOS = ("none", "random2", "straggler")
#: The implementations that can be timed, in turn the wait-avoiding
#: collective, the blocking group allreduce (both with ``--group-algorithm``),
#: ``MPI_Allreduce`` over all ranks, ``MPI_Allreduce`` on a communicator
#: of the group's ranks (the library's floor for a group allreduce), and the
#: blocking group allreduce bound once (``group_allreduce_init``).
IMPLEMENTATIONS = ("wait_avoiding", "group_blocking", "global_allreduce", "group_library", "group_persistent")
#: What runs without ``--implementations``.
DEFAULT_IMPLEMENTATIONS = IMPLEMENTATIONS[:3]
#: The ratios reported, ``(label, numerator, denominator)``, where both ran.
RATIOS = (
    ("WA/blocking", "wait_avoiding", "group_blocking"),
    ("global/WA", "global_allreduce", "wait_avoiding"),
    ("blocking/library", "group_blocking", "group_library"),
    ("WA/library", "wait_avoiding", "group_library"),
    ("persistent/library", "group_persistent", "group_library"),
)


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
        kept[first + warmup : end] = True
    return kept


def round_order(round_index, implementations=DEFAULT_IMPLEMENTATIONS):
    """``implementations`` in the order round ``round_index`` runs them.

    Rotated by one each round, so none always runs first or last, and every
    second cycle of rotations reversed, so none always runs right after the
    same other one: over 2n rounds (n implementations) each runs twice in
    each turn and follows each other one equally often (at 8 ranks on 2
    cores the wait-avoiding rounds right after MPI_Allreduce ran slower than
    after the blocking group allreduce; docs/benchmarks.md, "Wait-avoiding
    group allreduce benchmark").
    """
    implementations = tuple(implementations)
    count = len(implementations)
    cycle = implementations if (round_index // count) % 2 == 0 else implementations[::-1]
    shift = round_index % count
    return cycle[shift:] + cycle[:shift]


@dataclass
class Steps:
    """What one rank measured per step: wall seconds (the injected delay plus
    the collective), CPU seconds of the whole process (every thread: the
    progress thread's work shows here) and of the main thread alone, and
    whether its contribution was fresh: arrays over steps, and after
    :meth:`~Steps.gather` (on the root) over (rank, step)."""

    seconds: np.ndarray
    process_cpu: np.ndarray
    main_cpu: np.ndarray
    fresh: np.ndarray

    @classmethod
    def empty(cls, count):
        return cls(np.zeros(count), np.zeros(count), np.zeros(count), np.ones(count, dtype=bool))

    def store(self, lo, hi, other):
        """Put ``other``'s steps at ``lo:hi``."""
        for field in fields(self):
            getattr(self, field.name)[lo:hi] = getattr(other, field.name)

    def gather(self, comm):
        """Every rank's steps on rank 0 (collective over ``comm``)."""
        return Steps(*(np.array(comm.gather(getattr(self, field.name))) for field in fields(self)))


def _process_cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _run(implementation, comm, buf, group_size, delays, delay_s, waits, first, algorithm="auto"):
    """Steps ``first, first + 1, ...`` of one implementation (``delays``:
    their rows of the delay table), as :class:`Steps`.  On an oversubscribed
    node the CPU per step is the cost that matters: every cycle one rank
    spends is one the others wait for.  The wait-avoiding and the blocking
    group allreduce wait for transfers the same way (``waits``; ``comm`` is
    set up so) and use the groups of the same iterations.  The wait-avoiding
    collective is opened for the round and closed after it (untimed), so its
    progress thread does not run while the others are timed."""
    steps = Steps.empty(len(delays))
    wa = groups = persistent = None
    grouping = ButterflyGrouping(comm.size, group_size)
    if implementation == "wait_avoiding":
        wa = WaitAvoidingGroupAllreduce(
            comm.data, buf, group_size=group_size, op="avg", waits=waits, first_iteration=first, algorithm=algorithm
        ).open()
    elif implementation == "group_library":
        groups = GroupCommunicators(comm, grouping)
    elif implementation == "group_persistent":
        persistent = group_allreduce_init(buf, comm=comm, group_size=group_size, op="avg", algorithm=algorithm)
    comm.data.Barrier()
    for i, delayed in enumerate(delays[:, comm.rank]):
        t = first + i
        cpu, main_cpu = _process_cpu(), time.thread_time()
        start = time.perf_counter()  # the CPU readings stay out of the wall time
        if delayed:
            time.sleep(delay_s)
        if wa is not None:
            result = wa.allreduce(buf, t)  # buf is lent; the model moves to value
            steps.fresh[i] = result.fresh
            if not result.fresh:
                combine_stale(result.value, buf, group_size)
            buf = result.value
        elif persistent is not None:
            persistent(t)
        elif implementation == "group_blocking":
            group_allreduce(buf, comm=comm, group_size=group_size, t=t, op="avg", algorithm=algorithm, check=False)
        elif groups is not None:
            members = tuple(grouping.group_of(t, comm.rank))
            groups.communicator(members).Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
            buf *= 1.0 / len(members)
        else:
            comm.data.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
            buf *= 1.0 / comm.size
        steps.seconds[i] = time.perf_counter() - start
        steps.process_cpu[i] = _process_cpu() - cpu
        steps.main_cpu[i] = time.thread_time() - main_cpu
    if wa is not None:
        wa.close()
    if groups is not None:
        groups.close()
    return steps


def combine_stale(mean, contribution, group_size, chunk=1 << 16):
    """WAGMA Algorithm 2, line 13, in ``mean``: W_{t+1} = (S * mean + W'_t) / (S + 1).

    Chunk by chunk, so the scaled contribution is a temporary that stays in
    cache (numpy has no fused a * x + y).
    """
    scaled = np.empty(min(chunk, mean.size), dtype=mean.dtype)
    for lo in range(0, mean.size, chunk):
        out, part = mean[lo : lo + chunk], scaled[: min(chunk, mean.size - lo)]
        np.multiply(contribution[lo : lo + chunk], 1.0 / (group_size + 1), out=part)
        out *= group_size / (group_size + 1)
        out += part


def idle_progress_cpu(comm, buf, group_size, seconds):
    """Share of one core that this process uses while its progress thread idles."""
    with WaitAvoidingGroupAllreduce(comm.data, buf, group_size=group_size):
        cpu, wall = _process_cpu(), time.perf_counter()
        time.sleep(seconds)
        cpu, wall = _process_cpu() - cpu, time.perf_counter() - wall
    return cpu / wall


def default_group_size(size):
    """The paper's S ~ sqrt(P), as a power of two: 2**ceil(log2(P) / 2)."""
    return 1 << (((size.bit_length() - 1) + 1) // 2)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog=".venv/bin/mpiexec -n 8 .venv/bin/python -m mpi4py -m collectives.bench wagma",
        description="Time per iteration of the wait-avoiding group allreduce, the "
        "blocking group allreduce and MPI_Allreduce under injected delays.",
    )
    parser.add_argument("--size-mib", type=float, default=16.0)
    parser.add_argument(
        "--group-size", type=int, default=None, help="S (default 2**ceil(log2(P)/2), the paper's ~sqrt(P))"
    )
    parser.add_argument("--iterations", type=int, default=180, help="steps per implementation and scenario")
    parser.add_argument(
        "--rounds",
        type=int,
        default=6,
        help="the steps are run in this many rounds, the implementations "
        "taking turns within each (so drift in the machine's load "
        "reaches all of them alike)",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=10,
        help="first steps of each round left out of the statistics (the "
        "wait-avoiding collective is opened anew each round: its "
        "first steps allocate buffers and start a thread)",
    )
    parser.add_argument("--delay-ms", type=float, default=50.0)
    parser.add_argument(
        "--scenarios", default=",".join(SCENARIOS), help="comma-separated, from: " + ", ".join(SCENARIOS)
    )
    parser.add_argument(
        "--group-algorithm",
        choices=(*GROUP_ALLREDUCE_CHOICES, "auto"),
        default="auto",
        help="the group allreduce of wait_avoiding, group_blocking and group_persistent "
        "[auto: the butterfly that choose_group_allreduce picks for the size]",
    )
    parser.add_argument(
        "--implementations",
        default=",".join(DEFAULT_IMPLEMENTATIONS),
        help="comma-separated, from: "
        + ", ".join(IMPLEMENTATIONS)
        + " (a pair alone: no third one's after-effects in the "
        "rounds of the two compared)",
    )
    parser.add_argument("--idle-seconds", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--waits",
        choices=WAITS,
        default="auto",
        help="how the two group allreduces wait for transfers: spin "
        "(MPI_Waitall), yield (test with a back-off), auto (yield "
        "when the node has more ranks than cores)",
    )
    parser.add_argument("--out", default=None, help="HDF5 file (default results/wagma_bench/wagma_n{ranks}.h5)")
    args = parser.parse_args(argv)
    scenarios = args.scenarios.split(",")
    if any(s not in SCENARIOS for s in scenarios):
        parser.error(f"--scenarios must be from {', '.join(SCENARIOS)}, got {args.scenarios}")
    chosen = tuple(args.implementations.split(","))
    if any(i not in IMPLEMENTATIONS for i in chosen) or len(set(chosen)) != len(chosen):
        parser.error(
            f"--implementations must be distinct names from {', '.join(IMPLEMENTATIONS)}, got {args.implementations}"
        )
    if not 1 <= args.rounds <= args.iterations:
        parser.error(f"--rounds must be in 1..--iterations ({args.iterations}), got {args.rounds}")
    bounds = round_bounds(args.iterations, args.rounds)
    shortest = min(end - first for first, end in bounds)
    if not 0 <= args.warmup < shortest:
        parser.error(
            f"--warmup must be in 0..{shortest - 1} (the shortest round has {shortest} steps), got {args.warmup}"
        )
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
            measured = {i: Steps.empty(args.iterations) for i in chosen}
            for r, (first, end) in enumerate(bounds):
                for implementation in round_order(r, chosen):
                    measured[implementation].store(
                        first,
                        end,
                        _run(
                            implementation,
                            comm,
                            buf,
                            group_size,
                            delays[first:end],
                            args.delay_ms / 1e3,
                            waits,
                            first,
                            args.group_algorithm,
                        ),
                    )
            steps[scenario] = delays, {i: measured[i].gather(comm.data) for i in chosen}
        idle = comm.data.gather(idle_progress_cpu(comm, buf, group_size, args.idle_seconds))
        if comm.rank == 0:
            _report(comm.size, group_size, args, attrs, chosen, steps, idle, waits, bounds)


def _fast_ms(seconds, delays, kept):
    """Mean step time over the (rank, step) pairs of the ``kept`` steps whose
    rank was not delayed, in ms."""
    fast = ~delays[kept]
    if not fast.any():
        return float("nan")
    return float(seconds[:, kept].T[fast].mean() * 1e3)


def round_fast_ms(seconds, delays, bounds, warmup):
    """The mean step time over the (rank, step) pairs whose rank was not
    delayed, of each round alone (its steps after the warm-up), in ms.

    The implementations run the same round back to back, so a ratio of two
    of them within one round compares them under the same machine load;
    the spread of those ratios over the rounds is the run's own measure of
    how far its overall ratio can be trusted.
    """
    steps = np.arange(seconds.shape[1])
    return np.array([_fast_ms(seconds, delays, (steps >= first + warmup) & (steps < end)) for first, end in bounds])


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


def _report(size, group_size, args, attrs, chosen, steps, idle, waits, bounds):
    """Print the tables and write the HDF5 file (rank 0); ``steps`` maps each
    scenario to its delay table and the gathered :class:`Steps` of every
    implementation in ``chosen``."""
    kept = kept_steps(bounds, args.warmup)
    ratios = [(label, a, b) for label, a, b in RATIOS if a in chosen and b in chosen]
    with_wa = "wait_avoiding" in chosen
    print(
        f"wait-avoiding group allreduce: {size} ranks, {os.cpu_count()} cores, "
        f"{args.size_mib:g} MiB float32, S={group_size}, no sync steps, "
        f"{args.iterations} iterations in {args.rounds} interleaved rounds, group algorithm "
        f"{args.group_algorithm}, delay "
        f"{args.delay_ms:g} ms, group allreduces' "
        f"waits {waits}; {attrs['mpi_library']}"
    )
    print(
        f"ms per iteration on the ranks not delayed in that step (mean over ranks and "
        f"steps, first {args.warmup} steps of each round left out); "
        f"'-': every rank delayed"
    )
    print(
        f"{'scenario':>10} "
        + " ".join(f"{i:>18}" for i in chosen)
        + "".join(f"  {label:>11}" for label, _, _ in ratios)
        + ("  WA fresh" if with_wa else "")
    )
    for scenario, (delays, measured) in steps.items():
        ms = {i: _fast_ms(measured[i].seconds, delays, kept) for i in chosen}
        line = (
            f"{scenario:>10} "
            + " ".join(f"{ms[i]:18.2f}" for i in chosen)
            + "".join(f"  {ms[a] / ms[b]:11.2f}" for _, a, b in ratios)
        )
        if with_wa:
            line += f"  {measured['wait_avoiding'].fresh[:, kept].mean():8.0%}"
        print(line.replace("nan", "  -"))
    per_round = {
        scenario: {i: round_fast_ms(measured[i].seconds, delays, bounds, args.warmup) for i in chosen}
        for scenario, (delays, measured) in steps.items()
    }
    if ratios:
        print(
            f"the same ratios round by round (median [min, max] over the {args.rounds} "
            f"rounds; each round runs the implementations back to back):"
        )
        for scenario, rounds in per_round.items():
            print(
                f"{scenario:>10}"
                + "".join(f"   {label} {_spread(ratio_spread(rounds[a], rounds[b]))}" for label, a, b in ratios)
            )
    print(
        "CPU ms per rank and step, whole process / main thread (mean over all ranks "
        "and the kept steps; the difference is the progress thread's)"
    )
    print(f"{'scenario':>10} " + " ".join(f"{i:>18}" for i in chosen))
    for scenario, (_, measured) in steps.items():
        print(
            f"{scenario:>10} "
            + " ".join(
                f"{measured[i].process_cpu[:, kept].mean() * 1e3:10.2f} /"
                f"{measured[i].main_cpu[:, kept].mean() * 1e3:6.2f}"
                for i in chosen
            )
        )
    print(f"idle progress thread: {max(idle) * 100:.2f}% of a core (largest over ranks, {args.idle_seconds:g} s idle)")
    with results_file(args.out, os.path.join("wagma_bench", f"wagma_n{size}.h5"), attrs) as f:
        f.attrs.update(
            size_bytes=int(args.size_mib * MIB),
            group_size=group_size,
            iterations=args.iterations,
            rounds=args.rounds,
            warmup_per_round=args.warmup,
            delay_ms=args.delay_ms,
            seed=args.seed,
            sync_steps="none",
            dtype="float32",
            waits=waits,
            group_algorithm=args.group_algorithm,
        )
        f["idle_progress_cpu_fraction"] = np.array(idle)
        f["kept_steps"] = kept
        f["kept_steps"].attrs["axes"] = "step (in the statistics: not a round's warm-up)"
        f["round_order"] = np.array([[chosen.index(i) for i in round_order(r, chosen)] for r in range(args.rounds)])
        f["round_order"].attrs["axes"] = "round, turn (index into the implementations attribute)"
        f.attrs["implementations"] = ",".join(chosen)
        for scenario, (delays, measured) in steps.items():
            g = f.create_group(scenario)
            g["delayed"] = delays
            g["delayed"].attrs["axes"] = "step, rank"
            if with_wa:
                g["wait_avoiding_fresh"] = measured["wait_avoiding"].fresh
                g["wait_avoiding_fresh"].attrs["axes"] = "rank, step"
            for implementation in chosen:
                m = measured[implementation]
                g[implementation] = m.seconds
                g[implementation].attrs["axes"] = "rank, step (seconds: delay + collective)"
                g[implementation].attrs["fast_rank_ms_per_iteration"] = _fast_ms(m.seconds, delays, kept)
                g[implementation].attrs["fast_rank_ms_per_round"] = per_round[scenario][implementation]
                for name, cpu in (("process_cpu", m.process_cpu), ("main_thread_cpu", m.main_cpu)):
                    g[f"{implementation}_{name}"] = cpu
                    g[f"{implementation}_{name}"].attrs["axes"] = "rank, step (CPU seconds)"
                    g[f"{implementation}_{name}"].attrs["ms_per_step"] = float(cpu[:, kept].mean() * 1e3)
