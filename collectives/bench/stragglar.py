"""StragglAR against Ring, RHD, Broadcast and MPI_Allreduce with a late rank.

One rank (the straggler) sleeps ``--delay-ms`` before it enters each
allreduce; the others enter at once.  Every implementation runs in the same
repetition loop, taking turns, so drift in the machine's load hits all
alike.  Two times are kept per call (StragglAR paper, section 4):

* total: from the non-stragglers' entry to the last rank's return (Fig. 5c);
* after arrival: the total minus the straggler's measured sleep, i.e. from
  the straggler's entry to the last return.  The algorithmic bandwidth
  (buffer size / this time, Fig. 5a/5b) is computed from it.

Then a sweep over delays at one size finds the critical delay: the
smallest delay from which StragglAR's total is the lowest of all.  Next to
each measurement the alpha-beta model (:mod:`collectives.stragglar.cost`)
predicts the after-arrival time from alpha and beta fitted by a ping-pong
between ranks 0 and 1 in the same run.

With ``--delay-factors`` the benchmark asks instead what synchronization
costs when the straggler was predicted (as ``--sync stragglar`` does in training): for each size it first
measures the median total of the ring allreduce with no delay (rank 0's
median, broadcast so every rank sleeps alike), then runs StragglAR planned
for the late rank, StragglAR planned for the wrong rank, ring, RHD and
MPI_Allreduce with the late rank sleeping each factor times that median.
It prints a Markdown table per size (median totals, StragglAR's speedup
over ring, RHD and MPI_Allreduce, the wrong prediction's slowdown) and
writes it next to the HDF5 file (default ``results/stragglar_sync/``).

The wrong prediction (``stragglar_wrong``) plans the schedule for rank
(late + 1) % n while the late rank sleeps.  Its result is still the sum of
all inputs (checked once per size against ring's on exactly representable
data, late rank sleeping; the run fails if any implementation differs):
which rank is late never changes what the schedule computes, only when
each step can run.  What it does then (:mod:`collectives.stragglar.runtime`):
the predicted rank, on time, skips the pre-phase and waits in its first
round for a partner that is still in the ReduceScatter; the
"non-stragglers", the late rank among them, run their ring ReduceScatter,
each of whose n - 2 steps needs data that came from or through the late
rank, so it cannot end before about its own length after the late rank
enters; only then do the rounds start, whose first transfer the predicted
rank was waiting for.  Nothing of the delay d is hidden:

    wrong ~ d + (n - 2) (alpha + s beta / (n - 1)) + R (alpha + s beta / (n - 1))

against ``max(d, ReduceScatter) + R (alpha + s beta / (n - 1))`` for the
right prediction and ``d + 2 (n - 1) alpha + 2 (n - 1) / n s beta`` for ring:
in bandwidth terms (n - 2 + R) / (n - 1) s beta against 2 (n - 1) / n s beta,
2 against 1.5 s beta at n = 4 (R = 4) and 15/7 against 7/4 at n = 8
(R = 9), a constant loss to ring that the delay does not change.

``predicted`` is what training runs with ``--sync stragglar``: a
:class:`~collectives.stragglar.training_sync.PredictedStragglerSync` over
the buffer, which decides for itself between StragglAR planned for the
rank it predicts and the library's allreduce (``auto``), by the lead gate
of its module.  Its arrivals are the injected delays (the late rank's
sleep, 0 for the others); before each factor's repetitions it runs
:data:`PREDICTED_WARMUP` synchronizations untimed, so that its predictor
and its measured prices have settled.  ``pred/MPI``: its time over
``MPI_Allreduce``'s, at most 1/0.95 where it runs the library's speed.
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
from ..schedules.blocking import allreduce
from ..stragglar import broadcast_time, generate, rhd_time, ring_time, stragglar_time
from ..stragglar.runtime import StragglerAwareAllreduce
from ..stragglar.training_sync import PredictedStragglerSync

__all__ = ["main"]

MIB = 1 << 20
IMPLEMENTATIONS = ("stragglar", "broadcast", "ring", "rhd", "MPI_Allreduce")
#: The implementations of the ``--delay-factors`` mode, in the order of its
#: arrays; ``stragglar_wrong`` is StragglAR planned for (late + 1) % n,
#: ``predicted`` the training's synchronization, which chooses by itself.
SYNC_IMPLEMENTATIONS = ("stragglar", "stragglar_wrong", "ring", "rhd", "MPI_Allreduce", "predicted")
#: Untimed synchronizations of ``predicted`` before each factor's
#: repetitions: four to predict a persistent straggler, one to run
#: StragglAR and one to report its price, and two to spare.
PREDICTED_WARMUP = 8


def _implementations(comm, straggler, x, plans=None):
    """name -> callable(x), and the plans to close, for every implementation:
    ``plans`` (name -> StragglerAwareAllreduce; default StragglAR and
    Broadcast planned for ``straggler``) and ring, RHD and MPI_Allreduce."""
    if plans is None:
        plans = {
            name: StragglerAwareAllreduce(comm, straggler, x, algorithm=name) for name in ("stragglar", "broadcast")
        }
    runs = {name: (lambda y, plan=plan: plan(y, check=False)) for name, plan in plans.items()}
    for name in ("ring", "rhd"):
        runs[name] = lambda y, name=name: allreduce(y, comm=comm, algorithm=name, check=False)
    runs["MPI_Allreduce"] = lambda y: comm.data.Allreduce(MPI.IN_PLACE, y, op=MPI.SUM)
    return runs, plans


def _timed(run, x, comm, straggler, delay):
    """(total, after arrival) in seconds for one call, as the module says."""
    comm.data.Barrier()
    start = time.perf_counter()
    slept = 0.0
    if comm.rank == straggler and delay > 0:
        time.sleep(delay)
        slept = time.perf_counter() - start
    run(x)
    total = comm.data.allreduce(time.perf_counter() - start, op=MPI.MAX)
    slept = comm.data.allreduce(slept, op=MPI.MAX)
    return total, total - slept


def measure(comm, straggler, sizes_mib, delays, reps, warmup):
    """Seconds [implementation, size, delay, repetition, (total, after arrival)]."""
    times = np.zeros((len(IMPLEMENTATIONS), len(sizes_mib), len(delays), reps, 2))
    for j, mib in enumerate(sizes_mib):
        # Zeros stay finite however often they are summed in place.
        x = np.zeros(int(mib * MIB) // 4, dtype=np.float32)
        runs, plans = _implementations(comm, straggler, x)
        for k, delay in enumerate(delays):
            for rep in range(-warmup, reps):
                for i, name in enumerate(IMPLEMENTATIONS):
                    sample = _timed(runs[name], x, comm, straggler, delay)
                    if rep >= 0:
                        times[i, j, k, rep] = sample
        for plan in plans.values():
            plan.close()
    return times


def fit_alpha_beta(comm, nbytes, reps=20):
    """alpha (s) and beta (s/byte) from a ping-pong between ranks 0 and 1
    (8 bytes for alpha, ``nbytes`` for beta); every rank gets the pair."""
    result = np.zeros(2)
    for i, size in enumerate((8, nbytes)):
        msg = np.zeros(size, dtype=np.uint8)
        comm.data.Barrier()
        start = time.perf_counter()
        for _ in range(reps):
            if comm.rank == 0:
                comm.data.Send(msg, 1, 41)
                comm.data.Recv(msg, 1, 41)
            elif comm.rank == 1:
                comm.data.Recv(msg, 0, 41)
                comm.data.Send(msg, 0, 41)
        result[i] = (time.perf_counter() - start) / (2 * reps)
    comm.data.Bcast(result, 0)
    alpha = result[0]
    return alpha, max(result[1] - alpha, 0.0) / nbytes


def predicted(n, size_bytes, alpha, beta, rounds):
    """The alpha-beta time of each implementation after the straggler's
    arrival (MPI_Allreduce is modelled as RHD, MPICH's choice for large
    buffers)."""
    return {
        "stragglar": stragglar_time(n, size_bytes, alpha, beta, rounds),
        "broadcast": broadcast_time(n, size_bytes, alpha, beta),
        "ring": ring_time(n, size_bytes, alpha, beta),
        "rhd": rhd_time(n, size_bytes, alpha, beta),
        "MPI_Allreduce": rhd_time(n, size_bytes, alpha, beta),
    }


def _size_table(sizes_mib, times, model):
    """Bandwidth after arrival (GB/s) with the model's time next to each."""
    after = np.median(times[:, :, 0, :, 1], axis=2)
    total = np.median(times[:, :, 0, :, 0], axis=2)
    lines = [
        "size MiB  " + "  ".join(f"{n:>28}" for n in IMPLEMENTATIONS),
        "          " + "  ".join(f"{'GB/s  ms (model ms) total ms':>28}" for _ in IMPLEMENTATIONS),
    ]
    for j, mib in enumerate(sizes_mib):
        cells = [
            f"{mib * MIB / after[i, j] / 1e9:6.3f} {after[i, j] * 1e3:7.1f} "
            f"({model[j][name] * 1e3:6.1f}) {total[i, j] * 1e3:6.1f}"
            for i, name in enumerate(IMPLEMENTATIONS)
        ]
        lines.append(f"{mib:8g}  " + "  ".join(f"{c:>28}" for c in cells))
    return "\n".join(lines)


def critical_delay(delays, totals):
    """The smallest delay from which StragglAR's median total is below every
    other implementation's at that and every larger delay (None if never).
    ``totals`` is [implementation, delay]."""
    wins = [totals[0, k] < totals[1:, k].min() for k in range(len(delays))]
    for k in range(len(delays)):
        if all(wins[k:]):
            return delays[k]
    return None


def _sweep_table(delays, totals):
    lines = ["delay ms  " + "  ".join(f"{n:>13}" for n in IMPLEMENTATIONS)]
    for k, d in enumerate(delays):
        lines.append(f"{d * 1e3:8g}  " + "  ".join(f"{totals[i, k] * 1e3:13.1f}" for i in range(len(IMPLEMENTATIONS))))
    return "\n".join(lines)


def sync_speedups(totals):
    """Ratios of median totals, ``totals`` [implementation, ...] in the order
    of :data:`SYNC_IMPLEMENTATIONS`: ``over_ring``, ``over_rhd`` and
    ``over_MPI_Allreduce`` are the other's time over StragglAR's (above 1:
    StragglAR is faster); ``wrong_vs_ring`` and ``wrong_vs_right`` are the
    wrong prediction's time over ring's and over the right prediction's
    (above 1: the wrong prediction is slower); ``predicted_vs_MPI_Allreduce``
    is the training's synchronization's time over the library's."""
    t = dict(zip(SYNC_IMPLEMENTATIONS, np.asarray(totals, dtype=float)))
    return {
        "over_ring": t["ring"] / t["stragglar"],
        "over_rhd": t["rhd"] / t["stragglar"],
        "over_MPI_Allreduce": t["MPI_Allreduce"] / t["stragglar"],
        "wrong_vs_ring": t["stragglar_wrong"] / t["ring"],
        "wrong_vs_right": t["stragglar_wrong"] / t["stragglar"],
        "predicted_vs_MPI_Allreduce": t["predicted"] / t["MPI_Allreduce"],
    }


def sync_table(factors, delays, totals):
    """One size's Markdown table: delay factor, delay ms, median total ms per
    implementation and the ratios of :func:`sync_speedups`; ``delays`` in
    seconds per factor, ``totals`` [implementation, factor] in seconds."""
    ratios = sync_speedups(totals)
    head = (
        ["factor", "delay ms"]
        + [f"{name} ms" for name in SYNC_IMPLEMENTATIONS]
        + ["S/ring", "S/rhd", "S/MPI", "wrong/ring", "wrong/right", "pred/MPI"]
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for k, factor in enumerate(factors):
        cells = (
            [f"{factor:g}", _ms(delays[k])]
            + [_ms(totals[i][k]) for i in range(len(SYNC_IMPLEMENTATIONS))]
            + [f"{ratios[key][k]:.2f}" for key in ratios]
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _ms(seconds):
    """Milliseconds with one decimal, three below 1 ms (small buffers)."""
    return f"{seconds * 1e3:.1f}" if seconds >= 1e-3 else f"{seconds * 1e3:.3f}"


def sync_wins(factors, totals):
    """The factors at which StragglAR's median total is below ring's, RHD's
    and MPI_Allreduce's (the wrong prediction and the training's
    synchronization, which may run StragglAR itself, are not competitors)."""
    t = np.asarray(totals, dtype=float)
    rivals = [SYNC_IMPLEMENTATIONS.index(name) for name in ("ring", "rhd", "MPI_Allreduce")]
    return [f for k, f in enumerate(factors) if t[0, k] < t[rivals, k].min()]


def _check_data(x, rank):
    """Fill ``x`` with rank + (i mod 251) / 4: every partial sum of n <= 64
    such inputs is a float32 integer multiple of 1/4 below 2**22, so any
    order of additions gives the exact sum."""
    x[:] = rank + (np.arange(x.size, dtype=np.int32) % 251).astype(np.float32) / 4


def check_tolerance(n):
    """What float32 reassociation could move the check's sums by: n
    roundings of at most eps times the largest partial sum, n (251 / 4 + n)
    (the sums are exact, so any difference at all is an error in fact)."""
    return n * float(np.finfo(np.float32).eps) * n * (251 / 4 + n)


def check_results(comm, runs, x, late, delay):
    """Max ``|difference|`` of each sync implementation's result from ring's
    (ring's own entry: from the exact sum) on the check's exactly
    representable data (rank r's element i: ``r + (i % 251) / 4``), the
    late rank sleeping ``delay`` before each call; the same array on every
    rank.  Leaves ``x`` zero."""
    n = comm.size
    _check_data(x, comm.rank)
    _timed(runs["ring"], x, comm, late, delay)
    reference = x.copy()
    exact = (np.arange(x.size, dtype=np.int32) % 251).astype(np.float32) * (n / 4) + n * (n - 1) / 2
    errors = np.zeros(len(SYNC_IMPLEMENTATIONS))
    for i, name in enumerate(SYNC_IMPLEMENTATIONS):
        if name == "ring":
            errors[i] = np.abs(reference - exact).max(initial=0.0)
            continue
        _check_data(x, comm.rank)
        _timed(runs[name], x, comm, late, delay)
        errors[i] = np.abs(x - reference).max(initial=0.0)
    x[:] = 0
    comm.data.Allreduce(MPI.IN_PLACE, errors, op=MPI.MAX)
    return errors


def measure_sync(comm, late, sizes_mib, factors, reps, warmup):
    """The ``--delay-factors`` measurements (collective; the same on all ranks):
    seconds [implementation, size, factor, repetition, (total, after arrival)],
    ring's no-delay totals [size, repetition] and their medians [size] (rank
    0's, broadcast), and the check errors [implementation, size].  The
    implementations take turns in a rotating order, one rotation per
    repetition."""
    count = len(SYNC_IMPLEMENTATIONS)
    times = np.zeros((count, len(sizes_mib), len(factors), reps, 2))
    base_samples = np.zeros((len(sizes_mib), reps))
    base = np.zeros(len(sizes_mib))
    errors = np.zeros((count, len(sizes_mib)))
    ran_stragglar = np.zeros((len(sizes_mib), len(factors)))
    wrong = (late + 1) % comm.size
    for j, mib in enumerate(sizes_mib):
        x = np.zeros(int(mib * MIB) // 4, dtype=np.float32)
        runs, plans = _implementations(
            comm,
            late,
            x,
            plans={
                "stragglar": StragglerAwareAllreduce(comm, late, x),
                "stragglar_wrong": StragglerAwareAllreduce(comm, wrong, x),
            },
        )
        sync = PredictedStragglerSync(comm, [x], op="sum")
        arrival = [0.0]  # the late rank's: the factor's delay
        runs["predicted"] = lambda y: sync([y], arrival[0])
        ring = [_timed(runs["ring"], x, comm, late, 0.0)[0] for _ in range(warmup + reps)]
        base_samples[j] = ring[warmup:]
        base[j] = comm.data.bcast(float(np.median(base_samples[j])), root=0)
        errors[:, j] = check_results(comm, runs, x, late, base[j])
        bad = [
            f"{name} by {errors[i, j]:g}"
            for i, name in enumerate(SYNC_IMPLEMENTATIONS)
            if not errors[i, j] <= check_tolerance(comm.size)
        ]
        if bad:
            raise RuntimeError(
                f"wrong allreduce result at {mib:g} MiB on {comm.size} ranks, "
                f"late rank {late}: {', '.join(bad)} off ring's (ring: off "
                f"the exact sum); tolerance {check_tolerance(comm.size):g}"
            )
        for k, factor in enumerate(factors):
            arrival[0] = factor * base[j] if comm.rank == late else 0.0
            for _ in range(PREDICTED_WARMUP):
                _timed(runs["predicted"], x, comm, late, factor * base[j])
            first = len(sync.log)
            for rep in range(-warmup, reps):
                for step in range(count):
                    i = (step + rep) % count
                    sample = _timed(runs[SYNC_IMPLEMENTATIONS[i]], x, comm, late, factor * base[j])
                    if rep >= 0:
                        times[i, j, k, rep] = sample
            ran_stragglar[j, k] = np.mean(sync.rows()[first:, 1] >= 0)
        for plan in plans.values():
            plan.close()
        sync.close()
    return times, base_samples, base, errors, ran_stragglar


def _parse(argv):
    parser = argparse.ArgumentParser(
        prog=".venv/bin/mpiexec -n 8 .venv/bin/python -m mpi4py -m collectives.bench stragglar",
        description="Straggler-aware allreduce (StragglAR, Broadcast) against Ring, "
        "RHD and MPI_Allreduce with one late rank (float32, in place).",
    )
    parser.add_argument(
        "--delay-ms",
        type=float,
        default=None,
        help="the straggler's sleep before each call in the size scan (default 20)",
    )
    parser.add_argument(
        "--sizes-mib",
        default=None,
        help="comma-separated buffer sizes in MiB (default 1,4,16,64,256; with --delay-factors 16,32,64)",
    )
    parser.add_argument("--straggler", type=int, default=None, help="the late rank (default: the last)")
    parser.add_argument(
        "--sweep-mib", type=float, default=None, help="buffer size of the delay sweep (default 64; 0: no sweep)"
    )
    parser.add_argument(
        "--sweep-delays-ms", default=None, help="comma-separated delays of the sweep (default 0,2,5,10,20,40,80)"
    )
    parser.add_argument(
        "--delay-factors",
        default=None,
        help="comma-separated delays in multiples of ring's median time "
        "without delay at each size, for example 0,0.25,0.5,1,2: "
        "instead of the scan and the sweep, StragglAR planned for the "
        "late rank and for the wrong one against ring, RHD and "
        "MPI_Allreduce, a Markdown table per size",
    )
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument(
        "--out",
        default=None,
        help="HDF5 file (default results/stragglar/stragglar_n{ranks}.h5; with "
        "--delay-factors results/stragglar_sync/sync_n{ranks}.h5 and "
        "the tables next to it as .md)",
    )
    args = parser.parse_args(argv)
    args.sync = args.delay_factors is not None
    if args.sync:
        given = [
            flag
            for flag, value in (
                ("--delay-ms", args.delay_ms),
                ("--sweep-mib", args.sweep_mib),
                ("--sweep-delays-ms", args.sweep_delays_ms),
            )
            if value is not None
        ]
        if given:
            parser.error(f"--delay-factors replaces the scan and the sweep; drop {', '.join(given)}")
    try:
        args.sizes = [float(v) for v in (args.sizes_mib or ("16,32,64" if args.sync else "1,4,16,64,256")).split(",")]
        args.factors = [float(v) for v in args.delay_factors.split(",")] if args.sync else []
        args.delays = [float(d) / 1e3 for d in (args.sweep_delays_ms or "0,2,5,10,20,40,80").split(",")]
    except ValueError as exc:
        parser.error(f"comma-separated numbers needed: {exc}")
    args.delay_ms = 20.0 if args.delay_ms is None else args.delay_ms
    args.sweep_mib = 64.0 if args.sweep_mib is None else args.sweep_mib
    if (
        args.reps < 1
        or args.warmup < 0
        or min(args.sizes) <= 0
        or args.delay_ms < 0
        or min(args.delays) < 0
        or args.sweep_mib < 0
        or min(args.factors, default=0) < 0
    ):
        parser.error(
            "--reps >= 1, --warmup >= 0, positive --sizes-mib and "
            "non-negative delays, --delay-factors and --sweep-mib needed"
        )
    return parser, args


def main(argv: Sequence[str] | None = None) -> None:
    parser, args = _parse(argv)
    n = MPI.COMM_WORLD.size
    straggler = n - 1 if args.straggler is None else args.straggler
    if n < 2 or not 0 <= straggler < n:
        parser.error(
            f"needs at least 2 ranks and --straggler in range({n}); got {n} ranks, --straggler {args.straggler}"
        )
    with Communicator(MPI.COMM_WORLD) as comm:
        attrs = run_attributes(comm.data)
        if args.sync:
            load = os.getloadavg()
            measured = measure_sync(comm, straggler, args.sizes, args.factors, args.reps, args.warmup)
            if comm.rank == 0:
                attrs.update(loadavg_before=load[0], loadavg_after=os.getloadavg()[0])
                _report_sync(args, attrs, straggler, *measured)
            return
        scan = measure(comm, straggler, args.sizes, [args.delay_ms / 1e3], args.reps, args.warmup)
        sweep = (
            measure(comm, straggler, [args.sweep_mib], args.delays, args.reps, args.warmup) if args.sweep_mib else None
        )
        chunk = int(max(args.sizes) * MIB) // max(n - 1, 1)
        alpha, beta = fit_alpha_beta(comm, chunk)
        if comm.rank == 0:
            _report(args, attrs, straggler, scan, sweep, alpha, beta)


def _report_sync(args, attrs, late, times, base_samples, base, errors, ran_stragglar):
    """Print the ``--delay-factors`` tables, write them as Markdown and the
    HDF5 file next to it (rank 0)."""
    n = attrs["ranks"]
    wrong = (late + 1) % n
    rounds = len(generate(n, late).rounds)
    totals = np.median(times[..., 0], axis=3)  # implementation, size, factor
    delays = np.outer(base, args.factors)  # size, factor
    lines = [
        f"# StragglAR synchronization with a predicted straggler, {n} ranks",
        "",
        f"{n} ranks on {attrs['hostnames']} ({attrs['cores_per_host']} cores), "
        f"{attrs['mpi_library']}; float32 sum in place; late rank {late}, StragglAR "
        f"planned for it ({rounds} rounds) and, as `stragglar_wrong`, for rank {wrong}; "
        f"median of {args.reps} repetitions after {args.warmup} warm-up; git "
        f"{attrs['git_commit'][:10]}; 1-minute load average {attrs['loadavg_before']:.1f} "
        f"before, {attrs['loadavg_after']:.1f} after (other jobs on the machine "
        f"show as a load above the ranks' own).",
        "",
        "Times: median total in ms, from the on-time ranks' entry (after a barrier) to "
        "the last rank's return. Delay: the late rank's sleep before each call, the "
        "factor times ring's median total without delay at that size (measured first "
        "in the same run). S/x: x's time over StragglAR's (above 1: StragglAR is "
        "faster). wrong/ring, wrong/right: the wrong prediction's time over ring's and "
        "over StragglAR's with the right prediction (above 1: slower). predicted: "
        "the training's synchronization (PredictedStragglerSync), which picks StragglAR "
        "or the library's allreduce by itself; pred/MPI: its time over MPI_Allreduce's. "
        "Results checked "
        "against ring's once per size: max error "
        f"{errors.max():g} (tolerance {check_tolerance(n):g}).",
    ]
    for j, mib in enumerate(args.sizes):
        wins = sync_wins(args.factors, totals[:, j])
        lines += [
            "",
            f"## {mib:g} MiB (ring without delay: {base[j] * 1e3:.1f} ms)",
            "",
            sync_table(args.factors, delays[j], totals[:, j]),
            "",
            "StragglAR fastest at factors: " + (", ".join(f"{f:g}" for f in wins) if wins else "none"),
            "",
            "`predicted` ran StragglAR at this share of its synchronizations: "
            + ", ".join(f"{share:.0%} at factor {f:g}" for f, share in zip(args.factors, ran_stragglar[j])),
        ]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    out = args.out or os.path.join("results", "stragglar_sync", f"sync_n{n}.h5")
    with results_file(out, os.path.basename(out), attrs) as f:
        f.attrs.update(
            mode="sync",
            dtype="float32",
            reps=args.reps,
            warmup=args.warmup,
            late_rank=late,
            wrong_prediction=wrong,
            rounds=rounds,
            check_passed=True,
            check_tolerance=check_tolerance(n),
            timing="seconds; total: from the on-time ranks' entry (after a "
            "barrier) to the last return; after_arrival: total minus "
            "the late rank's measured sleep; delays: factor times "
            "ring's median total without delay at that size",
        )
        f["implementations"] = np.array(SYNC_IMPLEMENTATIONS, dtype="S")
        f["sizes_bytes"] = np.array(args.sizes) * MIB
        f["delay_factors"] = np.array(args.factors)
        f["delays_s"] = delays
        f["delays_s"].attrs["axes"] = "size, factor"
        f["ring_no_delay_seconds"] = base_samples
        f["ring_no_delay_seconds"].attrs["axes"] = "size, repetition"
        f["ring_no_delay_median_s"] = base
        f["seconds"] = times
        f["seconds"].attrs["axes"] = "implementation, size, factor, repetition, (total, after_arrival)"
        f["median_total_s"] = totals
        f["median_total_s"].attrs["axes"] = "implementation, size, factor"
        paired = sync_speedups(times[..., 0])  # size, factor, repetition
        for key, value in sync_speedups(totals).items():
            name = key if "_vs_" in key else f"speedup_{key}"
            f[name] = value
            f[name].attrs["axes"] = "size, factor"
            f[name].attrs["rule"] = "ratio of the median totals (the table's)"
            f[f"paired_{name}"] = np.median(paired[key], axis=-1)
            f[f"paired_{name}"].attrs["axes"] = "size, factor"
            f[f"paired_{name}"].attrs["rule"] = (
                "median over repetitions of the ratio within a repetition (the "
                "implementations run back to back, so load from elsewhere hits both)"
            )
        f["predicted_ran_stragglar"] = ran_stragglar
        f["predicted_ran_stragglar"].attrs["axes"] = "size, factor"
        f["predicted_ran_stragglar"].attrs["rule"] = (
            "share of predicted's timed synchronizations (warm-up repetitions included) that ran StragglAR"
        )
        f["check_max_abs_error"] = errors
        f["check_max_abs_error"].attrs["axes"] = "implementation, size"
    table = os.path.splitext(out)[0] + ".md"
    with open(table, "w") as md:
        md.write(text)
    print(f"wrote {table}")


def _report(args, attrs, straggler, scan, sweep, alpha, beta):
    """Print the tables and write the HDF5 file (rank 0)."""
    n = attrs["ranks"]
    rounds = len(generate(n, straggler).rounds)
    model = [predicted(n, mib * MIB, alpha, beta, rounds) for mib in args.sizes]
    print(
        f"stragglar on {n} ranks, {os.cpu_count()} cores, straggler {straggler}, "
        f"{rounds} rounds, {attrs['mpi_library']}"
    )
    print(
        f"ping-pong fit: alpha {alpha * 1e6:.1f} us, 1/beta {1 / beta / 1e9:.2f} GB/s"
        if beta > 0
        else f"ping-pong fit: alpha {alpha * 1e6:.1f} us, beta 0"
    )
    print(
        f"\nstraggler delay {args.delay_ms:g} ms; median of {args.reps}; time after "
        f"the straggler's arrival (alpha-beta model) and total from the others' entry"
    )
    print(_size_table(args.sizes, scan, model))
    with results_file(args.out, os.path.join("stragglar", f"stragglar_n{n}.h5"), attrs) as f:
        f.attrs.update(
            dtype="float32",
            reps=args.reps,
            warmup=args.warmup,
            straggler=straggler,
            rounds=rounds,
            alpha_s=alpha,
            beta_s_per_byte=beta,
            timing="seconds; total: from the non-stragglers' entry (after a "
            "barrier) to the last return; after_arrival: total minus "
            "the straggler's measured sleep",
        )
        f["implementations"] = np.array(IMPLEMENTATIONS, dtype="S")
        f["sizes_bytes"] = np.array(args.sizes) * MIB
        f["scan_delay_s"] = args.delay_ms / 1e3
        f["scan_seconds"] = scan[:, :, 0]
        f["scan_seconds"].attrs["axes"] = "implementation, size, repetition, (total, after_arrival)"
        f["model_seconds"] = np.array([[m[name] for name in IMPLEMENTATIONS] for m in model]).T
        f["model_seconds"].attrs["axes"] = "implementation, size"
        if sweep is not None:
            totals = np.median(sweep[:, 0, :, :, 0], axis=2)
            found = critical_delay(args.delays, totals)
            print(f"\ndelay sweep at {args.sweep_mib:g} MiB: median total from the others' entry, ms")
            print(_sweep_table(args.delays, totals))
            print(
                "critical delay: "
                + (
                    f"{found * 1e3:g} ms"
                    if found is not None
                    else "none in the sweep (StragglAR never the fastest from some delay on)"
                )
            )
            f["sweep_size_bytes"] = args.sweep_mib * MIB
            f["sweep_delays_s"] = np.array(args.delays)
            f["sweep_seconds"] = sweep[:, 0]
            f["sweep_seconds"].attrs["axes"] = "implementation, delay, repetition, (total, after_arrival)"
            f.attrs["critical_delay_s"] = np.nan if found is None else found
