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
"""

import argparse
import os
import time

import numpy as np
from mpi4py import MPI

from ..blocking import allreduce
from ..comm import Communicator
from ..stragglar import broadcast_time, generate, rhd_time, ring_time, stragglar_time
from ..stragglar.runtime import StragglerAwareAllreduce
from .provenance import results_file, run_attributes

__all__ = ["main"]

MIB = 1 << 20
IMPLEMENTATIONS = ("stragglar", "broadcast", "ring", "rhd", "MPI_Allreduce")


def _implementations(comm, straggler, x):
    """name -> (callable(x), plan or None) for every implementation."""
    plans = {name: StragglerAwareAllreduce(comm, straggler, x, algorithm=name)
             for name in ("stragglar", "broadcast")}
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
    lines = ["size MiB  " + "  ".join(f"{n:>28}" for n in IMPLEMENTATIONS),
             "          " + "  ".join(f"{'GB/s  ms (model ms) total ms':>28}"
                                      for _ in IMPLEMENTATIONS)]
    for j, mib in enumerate(sizes_mib):
        cells = [f"{mib * MIB / after[i, j] / 1e9:6.3f} {after[i, j] * 1e3:7.1f} "
                 f"({model[j][name] * 1e3:6.1f}) {total[i, j] * 1e3:6.1f}"
                 for i, name in enumerate(IMPLEMENTATIONS)]
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
        lines.append(f"{d * 1e3:8g}  " + "  ".join(
            f"{totals[i, k] * 1e3:13.1f}" for i in range(len(IMPLEMENTATIONS))))
    return "\n".join(lines)


def _parse(argv):
    parser = argparse.ArgumentParser(
        prog=".venv/bin/mpiexec -n 8 .venv/bin/python -m mpi4py -m collectives.bench stragglar",
        description="Straggler-aware allreduce (StragglAR, Broadcast) against Ring, "
                    "RHD and MPI_Allreduce with one late rank (float32, in place).")
    parser.add_argument("--delay-ms", type=float, default=20.0,
                        help="the straggler's sleep before each call in the size scan")
    parser.add_argument("--sizes-mib", default="1,4,16,64,256",
                        help="comma-separated buffer sizes in MiB")
    parser.add_argument("--straggler", type=int, default=None,
                        help="the late rank (default: the last)")
    parser.add_argument("--sweep-mib", type=float, default=64.0,
                        help="buffer size of the delay sweep (0: no sweep)")
    parser.add_argument("--sweep-delays-ms", default="0,2,5,10,20,40,80",
                        help="comma-separated delays of the sweep")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--out", default=None,
                        help="HDF5 file (default results/stragglar_n{ranks}.h5)")
    args = parser.parse_args(argv)
    args.sizes = [float(s) for s in args.sizes_mib.split(",")]
    args.delays = [float(d) / 1e3 for d in args.sweep_delays_ms.split(",")]
    if args.reps < 1 or args.warmup < 0 or min(args.sizes) <= 0 or args.delay_ms < 0 \
            or min(args.delays) < 0 or args.sweep_mib < 0:
        parser.error("--reps >= 1, --warmup >= 0, positive --sizes-mib and "
                     "non-negative delays and --sweep-mib needed")
    return parser, args


def main(argv=None):
    parser, args = _parse(argv)
    n = MPI.COMM_WORLD.size
    straggler = n - 1 if args.straggler is None else args.straggler
    if n < 2 or not 0 <= straggler < n:
        parser.error(f"needs at least 2 ranks and --straggler in range({n}); "
                     f"got {n} ranks, --straggler {args.straggler}")
    with Communicator(MPI.COMM_WORLD) as comm:
        attrs = run_attributes(comm.data)
        scan = measure(comm, straggler, args.sizes, [args.delay_ms / 1e3],
                       args.reps, args.warmup)
        sweep = (measure(comm, straggler, [args.sweep_mib], args.delays,
                         args.reps, args.warmup) if args.sweep_mib else None)
        chunk = int(max(args.sizes) * MIB) // max(n - 1, 1)
        alpha, beta = fit_alpha_beta(comm, chunk)
        if comm.rank == 0:
            _report(args, attrs, straggler, scan, sweep, alpha, beta)


def _report(args, attrs, straggler, scan, sweep, alpha, beta):
    """Print the tables and write the HDF5 file (rank 0)."""
    n = attrs["ranks"]
    rounds = len(generate(n, straggler).rounds)
    model = [predicted(n, mib * MIB, alpha, beta, rounds) for mib in args.sizes]
    print(f"stragglar on {n} ranks, {os.cpu_count()} cores, straggler {straggler}, "
          f"{rounds} rounds, {attrs['mpi_library']}")
    print(f"ping-pong fit: alpha {alpha * 1e6:.1f} us, 1/beta {1 / beta / 1e9:.2f} GB/s"
          if beta > 0 else f"ping-pong fit: alpha {alpha * 1e6:.1f} us, beta 0")
    print(f"\nstraggler delay {args.delay_ms:g} ms; median of {args.reps}; time after "
          f"the straggler's arrival (alpha-beta model) and total from the others' entry")
    print(_size_table(args.sizes, scan, model))
    with results_file(args.out, f"stragglar_n{n}.h5", attrs) as f:
        f.attrs.update(dtype="float32", reps=args.reps, warmup=args.warmup,
                       straggler=straggler, rounds=rounds, alpha_s=alpha, beta_s_per_byte=beta,
                       timing="seconds; total: from the non-stragglers' entry (after a "
                              "barrier) to the last return; after_arrival: total minus "
                              "the straggler's measured sleep")
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
            print(f"\ndelay sweep at {args.sweep_mib:g} MiB: median total from the others' "
                  f"entry, ms")
            print(_sweep_table(args.delays, totals))
            print("critical delay: " + (f"{found * 1e3:g} ms" if found is not None else
                                        "none in the sweep (StragglAR never the fastest "
                                        "from some delay on)"))
            f["sweep_size_bytes"] = args.sweep_mib * MIB
            f["sweep_delays_s"] = np.array(args.delays)
            f["sweep_seconds"] = sweep[:, 0]
            f["sweep_seconds"].attrs["axes"] = ("implementation, delay, repetition, "
                                                "(total, after_arrival)")
            f.attrs["critical_delay_s"] = np.nan if found is None else found
