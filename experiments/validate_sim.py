"""Validate the scale simulator (``wagma.sim``) against measured runs and set it beside the paper.

``python -m experiments.validate_sim [--measured results/sweep] [--out results/sim]``

1. *Measured.*  For every run of the emulated-compute sweep
   (``python -m experiments.campaign sweep``: 4 to 32 ranks, 600 ms steps,
   2 random ranks x 320 ms, ResNet-20 buffers) the simulator runs the same
   algorithm with the same options, imbalance spec, seed, steps and message
   size, with nothing fitted to it:

   * compute: the run's own measured compute times (its sleep's overshoot
     and the OS's jitter included);
   * alpha and beta: ``collectives.bench pingpong`` at the run's rank
     count, every pair exchanging at once and waiting as the algorithm's
     messages wait (:data:`YIELDING`);
   * an activation hop: that alpha plus :data:`POLL`;
   * ``Network.synchronization``, what a collective over all ranks costs
     beyond its messages (every rank's update and Python at once on the
     node's cores): measured by Allreduce-SGD runs without imbalance
     (:func:`synchronization_cost`), not by the sweep.

   Every throughput, every throughput ratio to Allreduce-SGD and
   WAGMA-SGD's stale fraction (the share of its group steps at which a
   rank's version began before it arrived) is a prediction, set beside the
   measured one.
2. *Paper.*  WAGMA-SGD's speedups at 64, 256 and 1024 ranks in the paper's
   two throughput settings (Figure 4: ResNet-50 v1, 25,559,081 parameters,
   2 random ranks x 320 ms, SGP with 2 peers; Figure 10: the 8,476,421
   parameters of the navigation model, compute drawn from 1.7 to 43.5 s,
   median 2 s, tau = 8, SGP with 4 peers), local SGD with the paper's
   period 1, on a Cray Aries-like network (alpha 2 us, 9 GB/s).

Writes the simulated runs of step 1 (``OUT/validation/``, beside the
measured ones for ``wagma.analysis``), the tables (``OUT/validation.md``,
``OUT/paper.md``) and prints them; exit status 1 when a prediction of step
1 is off by more than 15 %.
"""

import argparse
import logging
import os
import sys
from dataclasses import replace

import h5py
import numpy as np

from collectives.backoff import Backoff
from collectives.logs import configure_logging
from wagma.analysis.files import read_runs
from wagma.analysis.table import compare
from wagma.results import load_run
from wagma.sim import Network, Scenario, save, simulate

__all__ = [
    "ABLATIONS",
    "FIGURE10_VARIATIONS",
    "PAPER",
    "PINGPONG",
    "REPEATS",
    "SETTINGS",
    "SYNCHRONIZATION",
    "after_last_arrival",
    "figure10_sensitivity",
    "main",
    "measured_networks",
    "paper_throughput",
    "pingpong_network",
    "synchronization_cost",
    "validate",
]

logger = logging.getLogger(__name__)

SKIP = 5  # the sweep's table leaves out its first 5 steps
TOLERANCE = 0.15  # the bound the simulator is held to: |simulated / measured - 1|
#: Seconds an activation waits per level of the tree, beyond its message, on
#: this machine: a progress thread idle while its rank computes polls every
#: 4 ms (the cap of collectives.backoff.Backoff), so a control message waits
#: half that on average before it is seen and forwarded.
POLL = Backoff().cap / 2
ARIES = Network(2e-6, 1 / 9e9)

#: The paper's throughput claims (WAGMA-SGD's speedup over each algorithm),
#: section 5.2 (Figure 4, 64 nodes; "up to 1.37x" at 256) and 5.4 (Figure 10, 1,024 nodes).
PAPER = {
    "figure4": {
        64: {"local_sgd": 1.25, "allreduce_sgd": 1.26, "dpsgd": 1.23, "sgp": 1.25, "eager_sgd": 1.13},
        256: {"up to": 1.37},
    },  # its largest speedup over the baselines AD-PSGD excluded
    "figure10": {1024: {"local_sgd": 2.33, "dpsgd": 1.88, "sgp": 2.10}},
}


def _scenario(run, network):
    a = run.attrs
    return Scenario(
        ranks=int(a["ranks"]),
        steps=int(a["steps_planned"]),
        network=network,
        parameters=int(a["parameters"]),
        imbalance=a["imbalance"],
        compute_ms=float(a["compute_ms"]),
        seed=int(a["seed"]),
        model=a["model"],
        batch_size=int(a["batch_size"]),
    )


def _options(run):
    """The run's algorithm options as ``simulate`` takes them (JSON made
    hierarchical SGD's periods strings)."""
    options = dict(run.config["algorithm_options"])
    if "period_group_size_dict" in options:
        options["period_group_size_dict"] = {int(k): v for k, v in options["period_group_size_dict"].items()}
    return options


#: Where ``collectives.bench pingpong`` writes its files.
PINGPONG = os.path.join("results", "pingpong")
#: Algorithms whose messages wait by yielding on an oversubscribed node (the
#: wait-avoiding collectives' progress and main threads, AD-PSGD's gossip
#: thread); the blocking, background and neighbour exchanges spin.
YIELDING = {"wagma", "eager_sgd", "adpsgd"}


def pingpong_network(folder, ranks, waits):
    """The network ``collectives.bench pingpong`` measured at ``ranks`` with
    ``waits`` (alpha, beta); an activation takes that alpha (the control
    message, waited for as the runtime's progress threads wait) plus
    :data:`POLL` (until the receiving thread next polls)."""
    path = os.path.join(folder, f"pingpong_p{ranks}_{waits}.h5")
    if not os.path.exists(path):
        raise SystemExit(
            f"no ping-pong measurement {path}: run `.venv/bin/mpiexec -n {ranks} .venv/bin/python "
            f"-m mpi4py -m collectives.bench pingpong --waits {waits}` first"
        )
    with h5py.File(path, "r") as f:
        alpha = float(f.attrs["alpha_s"])
        return Network(alpha, float(f.attrs["beta_s_per_byte"]), alpha + POLL)


#: Where ``experiments.campaign sweep --algos allreduce_sgd --compute-ms 100
#: --imbalance none`` writes the runs that measure a global synchronization's cost.
SYNCHRONIZATION = os.path.join("results", "synchronization")


def after_last_arrival(run):
    """Seconds from the last rank's arrival at a step's allreduce to the
    ranks' ends of that step, averaged over ranks and over the steps after
    :data:`SKIP`: what a global synchronization costs once everyone is there."""
    clock, comm = run.steps["clock"][:, SKIP:], run.steps["comm_time"][:, SKIP:]
    return float(np.mean(clock - (clock - comm).max(axis=0)))


def _messages(run, network):
    """Seconds the run's allreduce (its whole buffer) takes on ``network``'s alpha and beta."""
    return network.allreduce(int(run.attrs["ranks"]), int(run.attrs["parameters"]) * 4).after_last


def synchronization_cost(run, network):
    """``Network.synchronization`` at the run's rank count: its
    :func:`after_last_arrival` less what the allreduce's messages take on
    ``network`` (the alpha-beta time the simulator charges apart)."""
    return max(after_last_arrival(run) - _messages(run, network), 0.0)


def _synchronization_runs(folder, sizes):
    """The Allreduce-SGD runs without compute imbalance at each of ``sizes``, by rank count."""
    runs = {}
    for ranks in sizes:
        path = os.path.join(folder, f"allreduce_sgd_p{ranks}.h5")
        if not os.path.exists(path):
            raise SystemExit(
                f"no synchronization measurement {path}: run `.venv/bin/python -m experiments.campaign "
                f"sweep --algos allreduce_sgd --ranks {ranks} --compute-ms 100 --imbalance none "
                f"--steps 40 --out-dir {folder}` first"
            )
        runs[ranks] = load_run(path)
    return runs


def _network(networks, run):
    return networks[int(run.attrs["ranks"]), "yield" if run.attrs["algorithm"] in YIELDING else "spin"]


def measured_networks(sizes, pingpong_dir=PINGPONG, synchronization_dir=SYNCHRONIZATION):
    """``(networks, runs)``: ``{(P, waits): Network}`` for each P of ``sizes``
    and both waits, :func:`pingpong_network` with the ``synchronization``
    of :func:`synchronization_cost` (its allreduce's messages on the
    spinning network, as Allreduce-SGD's background thread waits), and the
    runs that measured that cost, by P."""
    alone = _synchronization_runs(synchronization_dir, sizes)
    cost = {p: synchronization_cost(alone[p], pingpong_network(pingpong_dir, p, "spin")) for p in sizes}
    networks = {
        (p, w): replace(pingpong_network(pingpong_dir, p, w), synchronization=cost[p])
        for p in sizes
        for w in ("spin", "yield")
    }
    return networks, alone


#: More runs of the sweep's WAGMA-SGD at 16 ranks, measured after the model
#: was settled (``experiments.campaign sweep --algos wagma --ranks 16``, one
#: folder each): how much one run's stale fraction varies, predicted like the sweep's.
REPEATS = os.path.join("results", "sweep-repeats")


def _simulate(run, networks, traced=True, **change):
    """``run`` simulated on its network (``change``: Network fields replaced)
    and on its own compute times (``traced``) or the drawn ones."""
    return simulate(
        run.attrs["algorithm"],
        _scenario(run, replace(_network(networks, run), **change)),
        skip=SKIP,
        compute=run.steps["compute_time"] if traced else None,
        **_options(run),
    )


def _throughput_rows(measured_rows, simulated):
    """``(key, measured row, simulated row, throughput error, ratio error)``
    per algorithm and P, sorted: ``measured_rows`` from
    :func:`~wagma.analysis.table.compare` of the measured runs, ``simulated``
    the runs that predict them."""
    simulated_rows = {(row["algorithm"], row["ranks"]): row for row in compare(simulated, skip=SKIP)}
    return [
        (
            key,
            m,
            simulated_rows[key],
            simulated_rows[key]["throughput"] / m["throughput"] - 1,
            simulated_rows[key]["speedup"] / m["speedup"] - 1,
        )
        for key, m in sorted(measured_rows.items())
    ]


def _group_steps(run):
    tau = int(run.attrs["tau"])
    return [t for t in range(SKIP, int(run.attrs["steps_planned"])) if (t + 1) % tau]


def _stale(run, steps):
    return float(np.mean(np.asarray(run.steps["stale"])[:, steps]))


def _stale_rows(labelled, simulated):
    """``(label, measured, simulated, error)`` of WAGMA-SGD's stale fraction
    over its group steps; ``labelled``: ``(label, run)``, ``simulated`` the
    runs that predict them."""
    rows = []
    for (label, run), sim in zip(labelled, simulated):
        steps = _group_steps(run)
        measured, predicted = _stale(run, steps), _stale(sim, steps)
        rows.append((label, measured, predicted, predicted / measured - 1 if measured else 0.0))
    return rows


def _predict(runs, wagma, measured_rows, networks, traced=True, **change):
    """``(simulated runs, throughput rows, stale rows)``: ``runs`` and the
    ``(label, run)`` pairs of ``wagma`` simulated by :func:`_simulate` with
    ``traced`` and ``change``, each run once (the sweep's WAGMA-SGD runs are
    in both), set beside ``measured_rows``."""
    simulated = [_simulate(r, networks, traced, **change) for r in runs]
    of = {id(r): sim for r, sim in zip(runs, simulated)}
    stale = _stale_rows(
        wagma, [of[id(r)] if id(r) in of else _simulate(r, networks, traced, **change) for _, r in wagma]
    )
    return simulated, _throughput_rows(measured_rows, simulated), stale


def _repeats(folder):
    """The complete emulated WAGMA-SGD runs in ``folder`` (None: none)."""
    if folder is None:
        return []
    if not os.path.isdir(folder):
        raise SystemExit(f"--repeats: no folder {folder} (pass '' for none)")
    runs, skipped = read_runs([folder])
    wrong = [
        r.path
        for r in runs
        if not (
            r.attrs.get("algorithm") == "wagma"
            and r.attrs.get("status") == "complete"
            and r.attrs.get("compute") == "emulate"
        )
    ]
    if skipped or wrong or not runs:
        raise SystemExit(
            f"--repeats {folder}: expected complete emulated WAGMA-SGD runs; unreadable: "
            f"{[path for path, _ in skipped]}, not such runs: {wrong}"
        )
    return runs


#: What :func:`validate`'s ablation table changes, one at a time: ``(label,
#: on the measured compute times, Network fields replaced)``; the first is
#: the prediction itself, the one without measured compute gives the stale
#: table's drawn column.
ABLATIONS = [
    ("as measured (the tables above)", True, {}),
    ("no synchronization cost", True, {"synchronization": 0.0}),
    (f"activation hop {POLL * 1e3:.0f} ms, without its message's alpha", True, {"activation": POLL}),
    (f"activation hop {POLL / 2 * 1e3:.0f} ms", True, {"activation": POLL / 2}),
    ("drawn compute (no jitter) instead of the measured", False, {}),
]


def _worst(rows, value):
    """``(largest |value|, its row's label)``."""
    row = max(rows, key=lambda r: abs(value(r)))
    return abs(value(row)), row[0]


def _network_lines(networks, alone, runs, synchronization_dir):
    """The measured parameters: the ping-pong's networks and the synchronization cost, by P."""
    sweep = {int(r.attrs["ranks"]): after_last_arrival(r) for r in runs if r.attrs["algorithm"] == "allreduce_sgd"}
    lines = [
        "Nothing fitted: each run simulated on its own measured compute times, with alpha and beta "
        "from `collectives.bench pingpong` at its rank count (every pair at once, waiting as its "
        f"algorithm's messages wait: yielding for {', '.join(sorted(YIELDING))}, spinning for the "
        f"others), activations taking that alpha plus {POLL * 1e3:.0f} ms (the poll's wait) per tree "
        "level, and what a collective over all ranks costs beyond its messages once every rank is "
        "there (the ranks' arithmetic, threads, updates and Python at once on the node's cores), "
        "measured without imbalance: Allreduce-SGD with 100 ms of compute and no delays, from the last "
        "rank's arrival to the step's end, less the allreduce's alpha-beta time "
        f"(`{synchronization_dir}`). The sweep's own figure, beside it, is not used.",
        "",
        "| P | waits | alpha (us) | 1/beta (GB/s) | activation hop (ms) |",
        "|---:|---|---:|---:|---:|",
    ]
    for (p, w), net in sorted(networks.items()):
        lines.append(
            f"| {p} | {w} | {net.alpha * 1e6:.1f} | "
            f"{1 / net.beta / 1e9 if net.beta else float('inf'):.2f} | {net.hop * 1e3:.2f} |"
        )
    lines += [
        "",
        "| P | after the last arrival, no imbalance (ms) | allreduce's messages (ms) | "
        "synchronization (ms) | after the last arrival in the sweep (ms) |",
        "|---:|---:|---:|---:|---:|",
    ]
    for p in sorted(alone):
        in_sweep = f"{sweep[p] * 1e3:.1f}" if p in sweep else "-"
        lines.append(
            f"| {p} | {after_last_arrival(alone[p]) * 1e3:.1f} | "
            f"{_messages(alone[p], networks[p, 'spin']) * 1e3:.1f} | "
            f"{networks[p, 'spin'].synchronization * 1e3:.1f} | {in_sweep} |"
        )
    return lines


def validate(measured_dir, out_dir, pingpong_dir=PINGPONG, synchronization_dir=SYNCHRONIZATION, repeats_dir=REPEATS):
    """Simulate every complete emulated run of ``measured_dir`` with nothing
    fitted (see the module) and save the simulated runs in
    ``out_dir/validation``; WAGMA-SGD's runs in ``repeats_dir`` (None: none)
    have their stale fractions predicted too.  Returns the tables' text, the
    largest |error| of a throughput, a throughput ratio to Allreduce-SGD or
    a stale fraction, and the networks of :func:`measured_networks`."""
    runs, skipped = read_runs([measured_dir])
    runs = [r for r in runs if r.attrs.get("status") == "complete" and r.attrs.get("compute") == "emulate"]
    if skipped or not runs:
        raise SystemExit(f"no complete emulated runs in {measured_dir} ({len(skipped)} unreadable)")
    wagma = sorted(
        (
            (str(r.attrs["ranks"]), r)
            for r in runs
            if r.attrs["algorithm"] == "wagma" and _options(r).get("wait_avoiding", True)
        ),
        key=lambda pair: int(pair[0]),
    )
    wagma += [(f"{r.attrs['ranks']} ({os.path.basename(r.path)})", r) for r in _repeats(repeats_dir)]
    networks, alone = measured_networks(
        sorted({int(r.attrs["ranks"]) for r in runs}), pingpong_dir, synchronization_dir
    )
    measured_rows = {(row["algorithm"], row["ranks"]): row for row in compare(runs, skip=SKIP)}
    predictions = {
        label: _predict(runs, wagma, measured_rows, networks, traced, **change) for label, traced, change in ABLATIONS
    }
    simulated, throughput, stale = predictions[ABLATIONS[0][0]]
    drawn = next(predictions[label][2] for label, traced, _ in ABLATIONS if not traced)
    for r, sim in zip(runs, simulated):
        save(sim, os.path.join(out_dir, "validation", f"{r.attrs['algorithm']}_p{r.attrs['ranks']}.h5"))
    worst = max(max(max(abs(row[3]), abs(row[4])) for row in throughput), max(abs(row[3]) for row in stale))
    lines = _network_lines(networks, alone, runs, synchronization_dir)
    lines += [
        "",
        "| algorithm | P | measured samples/s | simulated samples/s | error | measured ratio | "
        "simulated ratio | error |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, m, s, absolute, ratio in throughput:
        lines.append(
            f"| {key[0]} | {key[1]} | {m['throughput']:.0f} | {s['throughput']:.0f} | "
            f"{100 * absolute:+.1f} % | {m['speedup']:.2f} | {s['speedup']:.2f} | {100 * ratio:+.1f} % |"
        )
    lines += [
        "",
        "WAGMA-SGD's stale fraction over its group steps (a rank is stale when the first rank's "
        "activation reaches it before it arrives): measured; simulated on the run's measured compute "
        "times (the prediction); simulated on the drawn compute, which has no jitter: every undelayed "
        "rank arrives at once, and only the delayed ranks and those behind them are stale.",
        "",
        "| P | measured | simulated | error | simulated, drawn compute |",
        "|---:|---:|---:|---:|---:|",
    ]
    for (label, measured, predicted, error), (*_, without_jitter, _) in zip(stale, drawn):
        lines.append(f"| {label} | {measured:.3f} | {predicted:.3f} | {100 * error:+.1f} % | {without_jitter:.3f} |")
    lines += [
        "",
        f"Largest |error| of a throughput, a ratio or a stale fraction: {100 * worst:.1f} % "
        f"(bound {100 * TOLERANCE:.0f} %).",
        "",
    ] + _ablation_lines(predictions)
    return "\n".join(lines), worst, networks


def _ablation_lines(predictions):
    """The ablation table: the largest errors of :func:`_predict`'s
    ``predictions`` (by label) with each of :data:`ABLATIONS` applied alone."""
    lines = [
        "What each measured term does: the largest |error| with one of them changed, the rest as measured.",
        "",
        "| change | throughput | ratio to Allreduce-SGD | stale fraction |",
        "|---|---:|---:|---:|",
    ]
    for label, _, _ in ABLATIONS:
        _, throughput, stale = predictions[label]
        cells = [
            _worst([(f"{k[0]} at {k[1]}", a) for k, _, _, a, _ in throughput], lambda r: r[1]),
            _worst([(f"{k[0]} at {k[1]}", q) for k, _, _, _, q in throughput], lambda r: r[1]),
            _worst([(f"P = {row[0]}", row[3]) for row in stale], lambda r: r[1]),
        ]
        lines.append(f"| {label} | " + " | ".join(f"{100 * v:.1f} % ({where})" for v, where in cells) + " |")
    return lines


#: The paper's two throughput settings; figure10's compute model is the one of
#: ``slurm/sweep.sh 10`` (our reading of Figure 9: 1.7 to 43.5 s, median 2 s);
#: figure10-light is the same with a lighter tail (sigma 0.5), to show how
#: much the speedups depend on how often an episode is long.
SETTINGS = {
    "figure4": (
        dict(imbalance="random:k=2,ms=320", compute_ms=600.0, parameters=25_559_081, model="resnet50-v1"),
        {
            "wagma": {"tau": 10},
            "allreduce_sgd": {"bucket_cap_mb": 25.0},
            "local_sgd": {"period": 1},
            # eager-SGD as the authors' code runs it: a random activator per version
            "dpsgd": {},
            "sgp": {"peers": 2},
            "eager_sgd": {"quorum": "majority"},
            "adpsgd": {},
        },
    ),
    "figure10": (
        dict(
            imbalance="lognormal:median_ms=2000,sigma=1,min_ms=1700,max_ms=43500",
            compute_ms=0.0,
            parameters=8_476_421,
            model="resnet18-lstm",
            batch_size=256,
        ),
        {"wagma": {"tau": 8}, "local_sgd": {"period": 1}, "dpsgd": {}, "sgp": {"peers": 4}, "adpsgd": {}},
    ),
    "figure10-light": (
        dict(
            imbalance="lognormal:median_ms=2000,sigma=0.5,min_ms=1700,max_ms=43500",
            compute_ms=0.0,
            parameters=8_476_421,
            model="resnet18-lstm",
            batch_size=256,
        ),
        {"wagma": {"tau": 8}, "local_sgd": {"period": 1}, "dpsgd": {}, "sgp": {"peers": 4}, "adpsgd": {}},
    ),
}


def paper_throughput(setting, ranks):
    """Samples/s of every algorithm of ``SETTINGS[setting]`` at ``ranks``, simulated on the Aries-like network."""
    common, algos = SETTINGS[setting]
    throughput = {}
    for algo, options in algos.items():
        if algo == "wagma":
            options = dict(options, group_size=1 << int(np.ceil(np.log2(ranks) / 2)))
        run = simulate(algo, Scenario(ranks=ranks, steps=1000, network=ARIES, **common), **options)
        throughput[algo] = run.summary["throughput"]
    return throughput


def _lognormal(sigma=1, max_ms=43500):
    return f"lognormal:median_ms=2000,sigma={sigma},min_ms=1700,max_ms={max_ms}"


#: Figure 10's setting with one assumption changed at a time: ``(label,
#: changes)``, the changes being Scenario fields, ``network``, ``tau`` or ``steps``.
FIGURE10_VARIATIONS = [
    ("our reading (lognormal, median 2 s, sigma 1, 1.7-43.5 s; Aries; 8.5 M parameters; tau 8; 1000 steps)", {}),
    ("episodes: sigma 0.5", {"imbalance": _lognormal(sigma=0.5)}),
    ("episodes: sigma 0.25", {"imbalance": _lognormal(sigma=0.25)}),
    ("episodes: clipped at 10 s", {"imbalance": _lognormal(max_ms=10000)}),
    ("model: 10x the parameters", {"parameters": 84_764_210}),
    ("network: 10x alpha, 1/10 the bandwidth", {"network": Network(20e-6, 10 / 9e9)}),
    ("network: 100x alpha, 1/100 the bandwidth", {"network": Network(200e-6, 100 / 9e9)}),
    ("run: 50 steps", {"steps": 50}),
    ("run: 200 steps", {"steps": 200}),
    ("WAGMA: tau 16", {"tau": 16}),
    ("WAGMA: tau 64", {"tau": 64}),
    ("WAGMA: tau 64, episodes sigma 0.5", {"tau": 64, "imbalance": _lognormal(sigma=0.5)}),
]


def figure10_sensitivity(ranks=1024):
    """Lines of a table: WAGMA-SGD's speedup over local SGD, D-PSGD and SGP
    in Figure 10's setting at ``ranks``, with each of
    :data:`FIGURE10_VARIATIONS` applied alone, under the paper's figures;
    then what the rows show (:func:`_figure10_reading`)."""
    common, algos = SETTINGS["figure10"]
    baselines = ("local_sgd", "dpsgd", "sgp")
    lines = [
        f"Figure 10 at {ranks} ranks, one assumption changed at a time: WAGMA-SGD's speedup over",
        "",
        "| variation | local SGD | D-PSGD | SGP (4 peers) |",
        "|---|---:|---:|---:|",
        "| paper | " + " | ".join(f"{PAPER['figure10'][1024][a]:.2f}x" for a in baselines) + " |",
    ]
    speedups = {}
    for label, changes in FIGURE10_VARIATIONS:
        changes = dict(changes)
        network, tau, steps = changes.pop("network", ARIES), changes.pop("tau", 8), changes.pop("steps", 1000)
        scenario = Scenario(ranks=ranks, steps=steps, network=network, **{**common, **changes})
        throughput = {}
        for algo in ("wagma", *baselines):
            options = dict(algos[algo])
            if algo == "wagma":
                options.update(tau=tau, group_size=1 << int(np.ceil(np.log2(ranks) / 2)))
            throughput[algo] = simulate(algo, scenario, **options).summary["throughput"]
        speedups[label] = {a: throughput["wagma"] / throughput[a] for a in baselines}
        lines.append(f"| {label} | " + " | ".join(f"{speedups[label][a]:.2f}x" for a in baselines) + " |")
    return lines + [""] + _figure10_reading(speedups)


def _figure10_reading(speedups):
    """What the sensitivity rows say, with their figures."""
    paper = PAPER["figure10"][1024]
    ours = speedups[FIGURE10_VARIATIONS[0][0]]
    fixed_tau = {k: v for k, v in speedups.items() if not k.startswith("WAGMA:")}
    tail = {k: v for k, v in fixed_tau.items() if k.startswith("episodes:")}
    closest = min(tail, key=lambda k: abs(tail[k]["local_sgd"] - paper["local_sgd"]))
    best_dpsgd = max(fixed_tau, key=lambda k: fixed_tau[k]["dpsgd"])
    comm = [v["dpsgd"] for k, v in fixed_tau.items() if k.startswith(("model:", "network:"))]
    return [
        "Reading:",
        f"- *Over local SGD* the episode tail decides: local SGD (period 1) waits for the longest "
        f"of all episodes at every step, WAGMA-SGD once per tau. Our reading of Figure 9 "
        f"gives {ours['local_sgd']:.2f}x; {closest} gives {tail[closest]['local_sgd']:.2f}x against "
        f"the paper's {paper['local_sgd']:.2f}x. The figure's histogram is not in the text, so the "
        f"tail is not fitted.",
        f"- *Over D-PSGD* no setting of the paper's experiment comes near {paper['dpsgd']:.2f}x "
        f"while tau is the paper's 8: the largest is {fixed_tau[best_dpsgd]['dpsgd']:.2f}x "
        f"({best_dpsgd}); a 10x larger model or a network 10 to 100x slower moves it by at most "
        f"{max(abs(c - ours['dpsgd']) for c in comm):.2f} (2 s episodes dwarf an 8.5 M-parameter "
        f"exchange). Only a longer tau approaches it ({speedups['WAGMA: tau 64']['dpsgd']:.2f}x at "
        f"tau 64), and the paper states tau = 8. In the model a "
        f"delay reaches a D-PSGD rank one neighbour per step, so its step costs "
        f"{ours['dpsgd'] / ours['local_sgd']:.2f} of local SGD's; the paper's figures make it "
        f"{paper['dpsgd'] / paper['local_sgd']:.2f} of it, close to a global synchronization at "
        f"every step. Its D-PSGD coupled ranks much more tightly than neighbour waits do "
        f"(a global collective or barrier per step, or contention among 1024 concurrent "
        f"exchanges); the text does not say which, and the simulator models neither.",
        f"- *Over SGP (4 peers)* the same holds, less strongly: {ours['sgp']:.2f}x against "
        f"{paper['sgp']:.2f}x; four peers spread a delay four ways per step.",
    ]


def paper():
    lines = ["| setting | P | WAGMA-SGD over | paper | simulated |", "|---|---:|---|---:|---:|"]
    for setting in SETTINGS:
        for ranks in (64, 256, 1024):
            throughput = paper_throughput(setting, ranks)
            claims = PAPER.get(setting, {}).get(ranks, {})
            speedups = {algo: throughput["wagma"] / t for algo, t in throughput.items() if algo != "wagma"}
            for algo in sorted(speedups):
                claim = claims.get(algo)
                lines.append(
                    f"| {setting} | {ranks} | {algo} | {f'{claim:.2f}x' if claim else '-'} | {speedups[algo]:.2f}x |"
                )
            if "up to" in claims:
                best = max(v for algo, v in speedups.items() if algo != "adpsgd")
                lines.append(f"| {setting} | {ranks} | up to (all but adpsgd) | {claims['up to']:.2f}x | {best:.2f}x |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog=".venv/bin/python -m experiments.validate_sim",
        description="Validate the scale simulator (wagma.sim) against measured runs and set it beside the paper.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--measured", default=os.path.join("results", "sweep"), help="folder of the measured sweep's run files"
    )
    parser.add_argument(
        "--pingpong",
        default=PINGPONG,
        help="folder of collectives.bench pingpong's files, one per rank count and waits",
    )
    parser.add_argument(
        "--synchronization",
        default=SYNCHRONIZATION,
        help="folder of the Allreduce-SGD runs without imbalance that measure a global "
        "synchronization's cost, one per rank count",
    )
    parser.add_argument(
        "--repeats",
        default=REPEATS,
        help="folder of more WAGMA-SGD runs of the sweep whose stale fractions are predicted too ('': none)",
    )
    parser.add_argument(
        "--out",
        default=os.path.join("results", "sim"),
        help="folder for validation.md, paper.md and the simulated runs",
    )
    args = parser.parse_args(argv)
    configure_logging()
    table, worst, _ = validate(args.measured, args.out, args.pingpong, args.synchronization, args.repeats or None)
    comparison = paper() + "\n\n" + "\n".join(figure10_sensitivity())
    for name, text in (("validation.md", table), ("paper.md", comparison)):
        path = os.path.join(args.out, name)
        with open(path, "w") as f:
            f.write(text + "\n")
        print(text, end="\n\n")
        logger.info("wrote %s", path)
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
