"""``python -m collectives.stragglar {schedule,cost,rounds} ...``: schedules and the cost model.

``schedule -n 8 [--straggler R] [--json] [--plot FILE.png]`` generates and
verifies a schedule and prints it as rounds by ranks (or as JSON).
``cost [--n ...] [--size-gib 1] [--alpha-us 3] [--bandwidth-gibs 450]
[--plot FILE.png]`` prints the alpha-beta times of Ring, RHD, Broadcast and
StragglAR and StragglAR's speedups (the StragglAR paper's Figure 6b).  ``rounds
[--max-n 256]`` prints the round count of every even n against the lower
bound as a markdown table.  ``plans --n 1024,4096`` generates, verifies and
stores the plans of those rank counts in the plan cache
(:mod:`collectives.stragglar.plans`), so that a job's first StragglAR plan
is read, not built: run it once per machine before a large job.
"""

import argparse
import sys
import time

from .cost import broadcast_time, rhd_time, ring_time, stragglar_time
from .generator import generate, lower_bound, plan
from .plans import build_plan, load_plan, plan_cache_dir, store_plan
from .plots import plot_schedule, plot_speedup, schedule_grid
from .verify import verify

GIB = 1 << 30


def schedule_text(schedule) -> str:
    """Rounds by ranks: the chunk each rank receives, ``+`` for a reduction."""
    grid = schedule_grid(schedule)
    reduce = {(r, t.dst) for r, ts in enumerate(schedule.rounds) for t in ts if t.reduce}
    width = max(4, len(f"c{schedule.num_chunks - 1}+") + 1)
    head = "round " + "".join(f"{k}{'*' if k == schedule.straggler else ''}".rjust(width) for k in range(schedule.n))
    lines = [head]
    for r, row in enumerate(grid):
        cells = ["." if c < 0 else f"c{c}{'+' if (r, k) in reduce else ''}" for k, c in enumerate(row)]
        lines.append(f"{r:5d} " + "".join(cell.rjust(width) for cell in cells))
    return "\n".join(lines)


def _schedule(args):
    schedule = verify(generate(args.n, args.straggler))
    if args.json:
        print(schedule.to_json())
    else:
        print(f"{schedule!r}; lower bound {lower_bound(args.n)} rounds; verified")
        print(
            "cell: chunk received in that round (+: reduced with the straggler's "
            "exchange, .: nothing); * marks the straggler"
        )
        print(schedule_text(schedule))
    if args.plot:
        plot_schedule(schedule, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr if args.json else sys.stdout)


def cost_table(ns, size, alpha, beta):
    """Rows ``(n, rounds, {algorithm: seconds})`` for each n; the rounds are
    those of the generated schedule, checked by the verifier."""
    rows = []
    for n in ns:
        rounds = len(verify(generate(n)).rounds)
        rows.append(
            (
                n,
                rounds,
                {
                    "Ring": ring_time(n, size, alpha, beta),
                    "RHD": rhd_time(n, size, alpha, beta),
                    "Broadcast": broadcast_time(n, size, alpha, beta),
                    "StragglAR": stragglar_time(n, size, alpha, beta, rounds),
                },
            )
        )
    return rows


def _cost(args):
    ns = [int(v) for v in args.n.split(",")]
    size, alpha = args.size_gib * GIB, args.alpha_us * 1e-6
    beta = 1.0 / (args.bandwidth_gibs * GIB)
    rows = cost_table(ns, size, alpha, beta)
    print(
        f"alpha-beta model: s = {args.size_gib:g} GiB, alpha = {args.alpha_us:g} us, "
        f"beta = 1/({args.bandwidth_gibs:g} GiB/s); times in ms"
    )
    print(f"{'n':>5} {'rounds':>6} {'Ring':>8} {'RHD':>8} {'Bcast':>8} {'StragglAR':>9} {'vs Ring':>8} {'vs RHD':>7}")
    for n, rounds, t in rows:
        print(
            f"{n:5d} {rounds:6d} {t['Ring'] * 1e3:8.3f} {t['RHD'] * 1e3:8.3f} "
            f"{t['Broadcast'] * 1e3:8.3f} {t['StragglAR'] * 1e3:9.3f} "
            f"{t['Ring'] / t['StragglAR']:7.2f}x {t['RHD'] / t['StragglAR']:6.2f}x"
        )
    if args.plot:
        speedups = {name: [t[name] / t["StragglAR"] for _, _, t in rows] for name in ("Ring", "RHD", "Broadcast")}
        plot_speedup(
            ns,
            speedups,
            args.plot,
            f"s = {args.size_gib:g} GiB, alpha = {args.alpha_us:g} us, 1/beta = {args.bandwidth_gibs:g} GiB/s",
        )
        print(f"wrote {args.plot}")


def _rounds(args):
    """Round counts of the generator against the lower bound for even n."""
    print("| n | lower bound | rounds | excess | method |")
    print("|---:|---:|---:|---:|---|")
    for n in range(2, args.max_n + 1, 2):
        rounds, method = plan(n)
        bound = lower_bound(n)
        print(f"| {n} | {bound} | {len(rounds)} | {len(rounds) - bound} | {method} |")


def _plans(args):
    """Fill the plan cache with the plans of the given rank counts."""
    folder = plan_cache_dir()
    if folder is None:
        raise ValueError("the plan cache is off (COLLECTIVES_PLAN_CACHE=off): nothing to fill")
    try:
        ns = [int(v) for v in args.n.split(",")]
    except ValueError:
        ns = []
    if not ns or min(ns) < 2:
        raise ValueError(f"--n must be rank counts >= 2 separated by commas, got {args.n!r}")
    for n in ns:
        plan = load_plan(folder, n)
        state = "cached already"
        if plan is None:
            start = time.perf_counter()
            plan = build_plan(n)
            store_plan(folder, plan)
            state = f"generated and verified in {time.perf_counter() - start:.1f} s"
        print(f"n={n}: {plan.rounds} rounds, {len(plan.transfers)} transfers, {state}; {folder}")


def _even_range(text):
    return ",".join(str(n) for n in range(4, 257, 2)) if text == "even" else text


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog=".venv/bin/python -m collectives.stragglar",
        description="StragglAR schedules (generated and verified) and the alpha-beta cost model; "
        "COMMAND --help lists each command's options.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sched = sub.add_parser("schedule", help="generate, verify and show a schedule")
    sched.add_argument("-n", type=int, required=True, help="number of ranks")
    sched.add_argument("--straggler", type=int, default=None, help="the straggler's rank (default n - 1)")
    sched.add_argument("--json", action="store_true", help="print the schedule as JSON")
    sched.add_argument("--plot", default=None, help="write a rounds-by-ranks PNG here")
    cost = sub.add_parser("cost", help="alpha-beta times and StragglAR's speedups")
    cost.add_argument(
        "--n", default="4,8,16,32,64,128,256", help="comma-separated rank counts, or 'even' for 4, 6, ..., 256"
    )
    cost.add_argument("--size-gib", type=float, default=1.0)
    cost.add_argument("--alpha-us", type=float, default=3.0)
    cost.add_argument(
        "--bandwidth-gibs", type=float, default=450.0, help="1/beta in GiB/s (the paper: H100 NVLink, 450)"
    )
    cost.add_argument("--plot", default=None, help="write the speedup figure here")
    table = sub.add_parser("rounds", help="round counts for every even n, markdown")
    table.add_argument("--max-n", type=int, default=256)
    cache = sub.add_parser("plans", help="generate, verify and cache the plans of these rank counts")
    cache.add_argument("--n", required=True, help="comma-separated rank counts, e.g. 1024,4096")
    args = parser.parse_args(argv)
    try:
        if args.command == "schedule":
            _schedule(args)
        elif args.command == "rounds":
            _rounds(args)
        elif args.command == "plans":
            _plans(args)
        else:
            args.n = _even_range(args.n)
            _cost(args)
    except ValueError as exc:
        parser.error(str(exc))


if __name__ == "__main__":
    main()
