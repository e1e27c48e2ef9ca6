"""Simulate T training steps of one algorithm on P ranks: the scenario, the
per-step compute times, the kernel, and the result as a run in the schema of
measured runs (:mod:`wagma.results`)."""

import inspect
import json
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import h5py
import numpy as np
from numpy.typing import ArrayLike

from collectives.compression.codecs import CODECS
from collectives.stragglar.cost import plan_time, stragglar_min_lead
from collectives.stragglar.prediction import StragglerPredictor, predictor_problem
from collectives.stragglar.training_sync import PredictedStragglerSync
from collectives.wait_avoiding.activation import RandomActivators
from collectives.wait_avoiding.groups import ButterflyGrouping
from wagma.imbalance import parse_imbalance
from wagma.options import ALGORITHM_NAMES, OPTIONS, AlgorithmName, resolved_options
from wagma.results import SCHEMA, STEP_FIELDS, Run, straggler_summary, summarize, write_run

from . import kernels
from .network import COLLECTIVES, Collective, GlobalAllreduce, Network

__all__ = [
    "ALGORITHMS",
    "STRAGGLER_COLUMNS",
    "SYNCED",
    "Scenario",
    "SimulatedRun",
    "age_summary",
    "compute_times",
    "save",
    "simulate",
]


#: The algorithms whose global synchronizations may run StragglAR with a
#: predicted straggler (their option ``sync``).
SYNCED = tuple(name for name in ALGORITHM_NAMES if "sync" in OPTIONS[name].fields())

#: Simulated algorithms and their options with the defaults, those of
#: :func:`wagma.algorithms.create`, from the same options objects
#: (:mod:`wagma.options`).
ALGORITHMS = {name: OPTIONS[name]().as_dict() for name in ALGORITHM_NAMES}

_PREDICTOR = {
    name: p.default for name, p in inspect.signature(StragglerPredictor).parameters.items() if p.kind is p.KEYWORD_ONLY
}

#: The predicted stragglers whose plans the runtime keeps (its default).
_CACHED_PLANS = inspect.signature(PredictedStragglerSync).parameters["cached_plans"].default

#: The columns of a predicted run's ``tables["stragglers"]``, those of the
#: runtime's log (``sync/stragglers`` of a measured run).
STRAGGLER_COLUMNS = PredictedStragglerSync.COLUMNS


@dataclass(frozen=True)
class Scenario:
    """What is simulated, apart from the algorithm.

    Args:
        ranks: P.
        steps: T, steps per rank.
        network: alpha, beta, the activation hop and the synchronization
            cost (:class:`~wagma.sim.network.Network`).
        parameters: the model's parameter count; messages carry
            ``parameters * bytes_per_parameter`` bytes.
        imbalance: a :func:`wagma.imbalance.parse_imbalance` spec; its draws
            for ``seed`` are the ones a training run with that seed injects.
        compute_ms: a step's compute before injected delays (``delay``
            models); ``compute`` models draw the whole step.
        collective: the schedule of blocking allreduces over all P ranks,
            one of :data:`~wagma.sim.network.COLLECTIVES`; with ``sync="stragglar"``
            the one run while no straggler is predicted.
        model, batch_size: recorded (``batch_size`` makes the throughput samples/s).
        decay, confidence: the straggler predictor's
            (:class:`~collectives.stragglar.prediction.StragglerPredictor`,
            whose defaults these are), for ``sync="stragglar"``.
        min_lead_s: the lead (seconds) a predicted rank must have; None:
            the runtime's rule (:mod:`collectives.stragglar.training_sync`):
            :func:`~collectives.stragglar.cost.stragglar_min_lead` of
            StragglAR's ReduceScatter and rounds and the allreduce's time
            (infinite where the rounds alone take longer: small buffers),
            from the second synchronization on (the predictor's default
            before it has measured one).
    """

    ranks: int
    steps: int
    network: Network
    parameters: int
    imbalance: str = "none"
    compute_ms: float = 600.0
    collective: Collective = "auto"
    seed: int = 0
    model: str = "custom"
    batch_size: int = 128
    bytes_per_parameter: int = 4
    decay: float = _PREDICTOR["decay"]
    confidence: float = _PREDICTOR["confidence"]
    min_lead_s: float | None = None

    def __post_init__(self):
        for name in ("ranks", "steps", "parameters", "batch_size", "bytes_per_parameter"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if not (math.isfinite(self.compute_ms) and self.compute_ms >= 0):
            raise ValueError(f"compute_ms must be a finite number >= 0, got {self.compute_ms!r}")
        if self.collective not in COLLECTIVES:
            raise ValueError(f"collective must be one of {', '.join(COLLECTIVES)}, got {self.collective!r}")
        problem = predictor_problem(
            self.ranks,
            self.decay,
            self.confidence,
            _PREDICTOR["min_lead_s"] if self.min_lead_s is None else self.min_lead_s,
        )
        if problem:
            raise ValueError(problem)

    @property
    def nbytes(self) -> int:
        return self.parameters * self.bytes_per_parameter


def _draws(scenario):
    """Compute seconds ``[P, T]`` and the injected part of them."""
    model = parse_imbalance(scenario.imbalance, scenario.ranks, scenario.seed)
    drawn = np.ascontiguousarray(model.table(scenario.steps).T, dtype=np.float64)
    return (drawn + scenario.compute_ms / 1e3 if model.kind == "delay" else drawn), drawn


def compute_times(scenario: Scenario) -> np.ndarray:
    """``[P, T]`` seconds of each rank's compute, delays included: what
    ``experiments.train --compute emulate`` sleeps for the same imbalance and seed."""
    return _draws(scenario)[0]


def _options(algorithm, ranks, options):
    """The algorithm's options for ``ranks`` ranks: its options object's
    checks and "auto" values (:func:`wagma.options.resolved_options`), as a
    dict; raises ValueError naming the bad one."""
    out = resolved_options(algorithm, ranks, options).as_dict()
    if out.get("reallocate"):
        raise ValueError(
            "reallocate: the simulator does not model the reallocation of samples "
            "(its compute times are drawn per step, not per sample)"
        )
    return out


def _bucketed(scenario, cap_mb):
    """Allreduce-SGD's buckets, one allreduce after another (one for StragglAR), as a
    :class:`~wagma.sim.network.GlobalAllreduce`.  A bucket holds up to
    ``cap_mb`` MB of 10^6 bytes, the runtime's unit; the runtime closes a
    bucket at a parameter's boundary, which a parameter count does not
    tell, so here every bucket but the last is full."""
    net, total = scenario.network, scenario.nbytes
    if scenario.collective == "stragglar":
        return net.allreduce(scenario.ranks, total, "stragglar")
    cap = max(1, int(cap_mb * 1e6))
    sizes = [cap] * (total // cap) + ([total % cap] if total % cap else [])
    return GlobalAllreduce(sum(net.allreduce(scenario.ranks, s, scenario.collective).after_last for s in sizes))


def _ensemble_sync(scenario, options, compute):
    """EnsembleSync's ``(clock, skipped)``: a round's average costs the
    binomial tree among its m members, 2 ceil(log2 m) whole-buffer
    messages, and the report and decision two empty ones."""
    net = scenario.network
    costs = np.array(
        [
            2 * math.ceil(math.log2(m)) * net.message(scenario.nbytes) if m > 1 else 0.0
            for m in range(scenario.ranks + 1)
        ]
    )
    return kernels.ensemble_sync(compute, options["period"], float(options["timeout_s"]), costs, 2 * net.message(0))


def _prediction(scenario, options, tau, fallback):
    """The kernels' arguments after ``collective``: ``(planned, predictor,
    scores, record)``; StragglAR over the whole buffer is what a predicted
    synchronization runs (Allreduce-SGD's gradients too: one StragglAR, not
    one per bucket).  ``fallback``: the seconds of the allreduce run while
    no rank is predicted, as the runtime measures it (on the rank that
    arrived last: it did not wait), the network's synchronization cost
    included: the runtime times the allreduce with the ranks' contention
    for the cores in it."""
    p = scenario.ranks
    net = scenario.network
    planned = net.synchronized(net.allreduce(p, scenario.nbytes, "stragglar"), p).as_tuple()
    if options.get("sync") != "stragglar":
        return (planned, *kernels.no_prediction(p))
    if scenario.min_lead_s is None:
        # The runtime's gate, with the ReduceScatter and the rounds priced by the network
        # model; the runtime measures them from its first StragglAR synchronization on and
        # takes Table 1's bandwidth terms before (break_even_lead, close for large buffers).
        first = _PREDICTOR["min_lead_s"]
        gate = stragglar_min_lead(planned[2], planned[3], fallback) if p > 2 else 0.0
    else:
        first = gate = scenario.min_lead_s
    first_plan_s, new_plan_s = plan_time(p, net.alpha, net.beta)
    predictor = (
        True,
        float(scenario.decay),
        float(scenario.confidence),
        float(first),
        float(gate),
        first_plan_s,
        new_plan_s,
        float(_CACHED_PLANS),
    )
    record = np.full((scenario.steps // tau, len(kernels.SYNC_FIELDS)), np.nan)
    return planned, predictor, kernels.plan_scores(scenario.ranks), record


#: The algorithms that average every ``period`` steps and nothing between:
#: local SGD, and DiLoCo, whose outer step costs compute, not messages.
_PERIODIC = ("local_sgd", "diloco")


def _run_kernel(algorithm, scenario, options, compute, schedule):
    """``clock``, ``stale``, ``age`` ``[P, T]`` (``stale``/``age`` None where
    nothing is ever stale), and the predictor's log, :data:`STRAGGLER_COLUMNS`
    (None without ``sync="stragglar"``); what the kernel tells of who
    contributed what goes into ``schedule`` (:attr:`SimulatedRun.schedule`)."""
    net, p, nbytes = scenario.network, scenario.ranks, scenario.nbytes
    everyone = net.synchronized(net.allreduce(p, nbytes, scenario.collective), p).as_tuple()
    if algorithm not in SYNCED:
        return (*_other_kernel(algorithm, scenario, options, compute, everyone, schedule), None)
    tau = 1 if algorithm == "allreduce_sgd" else options["period" if algorithm in _PERIODIC else "tau"]
    if algorithm == "allreduce_sgd":
        everyone = net.synchronized(_bucketed(scenario, options["bucket_cap_mb"]), p).as_tuple()
    prediction = _prediction(scenario, options, tau, everyone[0])
    stale = age = None
    if algorithm == "allreduce_sgd":
        clock = kernels.local_sgd(compute, 1, everyone, *prediction)
    elif algorithm in _PERIODIC or not (options["wait_avoiding"] or options["group_averaging"]):
        clock = kernels.local_sgd(compute, tau, everyone, *prediction)
    else:
        grouping = ButterflyGrouping(p, options["group_size"], not options["fixed_groups"])
        phases, costs = net.butterfly_phases(1 << grouping.num_phases, nbytes)
        clock, stale, age, source = kernels.wagma(
            compute,
            tau,
            *group_tables(grouping),
            phases,
            costs,
            _fold_cost(net, grouping, nbytes),
            options["wait_avoiding"],
            net.hop,
            everyone,
            *prediction,
        )
        schedule["source"] = source
    if options["sync"] != "stragglar":
        return clock, stale, age, None
    record = prediction[-1]
    return clock, stale, age, np.column_stack([np.arange(record.shape[0], dtype=np.float64), record])


def group_tables(grouping: ButterflyGrouping) -> tuple[np.ndarray, np.ndarray]:
    """The groups of one period of iterations as the kernels take them:
    ``masks[L, k]`` (iteration t's masks are ``masks[t mod L]``) and
    ``hosts[L, P - core]`` (the core rank rank ``core + j`` is folded into)."""
    period, core, ranks = grouping.period, grouping.core_size, grouping.world_size
    masks = np.array([grouping.masks(t) for t in range(period)], dtype=np.int64).reshape(period, -1)
    hosts = np.array(
        [[grouping.plan(t, rank).folded_into for rank in range(core, ranks)] for t in range(period)], dtype=np.int64
    ).reshape(period, ranks - core)
    return masks, hosts


def _fold_cost(net: Network, grouping: ButterflyGrouping, nbytes: float) -> float:
    """A folded rank's buffer to its host, or back: one whole message (0 on 2**d ranks)."""
    return net.message(nbytes) if grouping.world_size > grouping.core_size else 0.0


def _other_kernel(algorithm, scenario, options, compute, everyone, schedule):
    """``clock``, ``stale``, ``age`` of the algorithms without global synchronizations to predict."""
    net, p, nbytes = scenario.network, scenario.ranks, scenario.nbytes
    if algorithm == "dpsgd":
        offsets = np.tile(np.array([1, -1], dtype=np.int64), (scenario.steps, 1))
        return kernels.neighbours(compute, offsets, 2 * net.message(nbytes) if p > 1 else 0.0), None, None
    if algorithm == "sgp":
        peers, rounds = options["peers"], max(1, (p - 1).bit_length())
        offsets = np.array(
            [[1 << ((t * peers + j) % rounds) for j in range(peers)] for t in range(scenario.steps)], dtype=np.int64
        )
        return kernels.neighbours(compute, offsets, peers * net.message(nbytes) if p > 1 else 0.0), None, None
    if algorithm == "adpsgd":
        clock, age, schedule["partner"], schedule["begin"], schedule["finish"] = kernels.adpsgd(
            compute, 2 * net.message(nbytes)
        )
        schedule["exchange_s"] = 2 * net.message(nbytes)
        return clock, None, age
    if algorithm == "eager_sgd":
        quorum = 1 if options["quorum"] == "solo" else (p + 1) // 2
        steps = np.arange(scenario.steps)
        activators = np.full(scenario.steps, -1, dtype=np.int64)
        if options["quorum"] == "majority":  # the runtime's sequence, version by version
            draw = RandomActivators(options["activator_seed"], p)
            activators[:] = [draw(t) for t in steps]
        limiter = options["limiter"]
        synchronous = (steps + 1) % (limiter + 1) == 0 if limiter else np.zeros(scenario.steps, dtype=bool)
        activation = (p - 1).bit_length() * net.hop
        everyone = ButterflyGrouping(p, p)  # the group allreduce, S = P: the core's phases, the fold there and back
        phases = net.butterfly_phases(everyone.core_size, nbytes)[1].sum()
        group = GlobalAllreduce(float(phases + 2 * _fold_cost(net, everyone, nbytes)))
        cost = net.synchronized(group, p).after_last
        clock, stale, age, schedule["taken"] = kernels.eager_sgd(
            compute, quorum, activators, synchronous, activation, cost, kernels.LATE_CODES[options["late"]]
        )
        return clock, stale, age
    if algorithm == "streaming_diloco":
        # A fragment's bytes as 1/M of the model's: the runtime's fragments are strides of
        # whole layers, uneven in size, and the message sizes of a model's layers are not here.
        m = options["fragments"]
        offsets = np.array([f * options["period"] // m for f in range(m)], dtype=np.int64)
        collective = "auto" if scenario.collective == "stragglar" else scenario.collective  # as below
        cost = net.synchronized(net.allreduce(p, nbytes / m, collective), p).after_last
        return kernels.streaming(compute, options["period"], offsets, options["overlap_steps"], cost), None, None
    levels = options["period_group_size_dict"]
    periods = np.array(list(levels), dtype=np.int64)
    sizes = np.array(list(levels.values()), dtype=np.int64)
    # A level of fewer ranks runs the runtime's choice where the scenario's collective is StragglAR
    # (planned for one straggler of all P ranks; its after_last is 0, the rounds' cost is apart).
    group = "auto" if scenario.collective == "stragglar" else scenario.collective
    costs = np.array([net.allreduce(int(g), nbytes, group).after_last for g in sizes])
    return kernels.hierarchical_sgd(compute, periods, sizes, costs, options["warmup_steps"], everyone), None, None


def age_summary(age: np.ndarray) -> tuple[float, float]:
    """Mean and largest age of the contributions averaged (NaN, NaN where nothing was)."""
    averaged = age[np.isfinite(age)]
    return (float(averaged.mean()), float(averaged.max())) if averaged.size else (math.nan, math.nan)


@dataclass
class SimulatedRun(Run):
    """A :class:`~wagma.results.reader.Run` made by the simulator, with ``age``
    ``[P, T]``: how many steps old each rank's averaged contribution was,
    and ``schedule``: who contributed what to each averaging where that
    depends on the times (WAGMA-SGD's ``source``, eager-SGD's ``taken``,
    AD-PSGD's ``partner``, ``begin``, ``finish`` and ``exchange_s``: see the
    kernels), the arrays :mod:`wagma.emulate` replays.  With ``sync="stragglar"`` its ``tables["stragglers"]`` is the
    predictor's log as a measured run has it (:data:`STRAGGLER_COLUMNS`, one
    row per global synchronization: its number, the rank predicted to arrive
    last (-1: none, the fallback collective ran), the rank that did, by how
    many seconds, and the lead the next prediction required), and its
    summary has :func:`~wagma.results.summary.straggler_summary`'s figures."""

    age: np.ndarray | None = field(default=None)
    schedule: dict[str, Any] = field(default_factory=dict)  # arrays; AD-PSGD's exchange_s in seconds


def simulate(
    algorithm: AlgorithmName, scenario: Scenario, skip: int = 0, compute: ArrayLike | None = None, **options: Any
) -> SimulatedRun:
    """Simulate ``algorithm`` with ``options`` (the keywords of
    :func:`wagma.algorithms.create`, with its defaults) in ``scenario``.

    ``compute``: ``[P, T]`` seconds of compute per rank and step to use
    instead of the scenario's draws, e.g. a measured run's ``compute_time``
    (trace-driven: the sleep's overshoot and the OS's jitter included).

    Returns a run in memory in the schema of measured runs (``compute`` is
    ``"simulated"``, so :mod:`wagma.analysis` compares simulated runs with
    each other and lists them beside measured ones); its summary skips the
    first ``skip`` steps.  Raises ValueError for a bad algorithm or option.
    """
    options = _options(algorithm, scenario.ranks, options)
    if options.get("compression", "none") != "none":
        # The averages' messages carry the codec's bytes (the encoding's compute is not modelled).
        codec = CODECS[options["compression"]]
        ratio = codec.wire_nbytes(scenario.parameters) / (4 * scenario.parameters)
        scenario = replace(scenario, network=replace(scenario.network, wire_ratio=ratio))
    drawn, injected = _draws(scenario)
    if compute is None:
        compute = drawn
    else:
        compute = np.ascontiguousarray(compute, dtype=np.float64)
        if compute.shape != drawn.shape or not (np.isfinite(compute).all() and (compute >= 0).all()):
            raise ValueError(
                f"compute must be [ranks, steps] = {list(drawn.shape)} finite seconds >= 0, "
                f"got shape {list(compute.shape)}"
            )
    if options.get("sync") == "stragglar" and scenario.collective == "stragglar":
        raise ValueError(
            "sync='stragglar' runs the scenario's collective while no straggler is predicted; "
            "collective='stragglar' (the oracle that always knows the last rank) cannot be that"
        )
    skipped = np.zeros_like(compute)
    stragglers = None
    schedule: dict[str, Any] = {}
    if algorithm == "ensemble_sync":
        (clock, skipped), stale, age = _ensemble_sync(scenario, options, compute), None, None
        compute, injected = compute * (1 - skipped), injected * (1 - skipped)
    else:
        clock, stale, age, stragglers = _run_kernel(algorithm, scenario, options, compute, schedule)
    previous = np.concatenate([np.zeros((scenario.ranks, 1)), clock[:, :-1]], axis=1)
    waited = np.maximum(clock - previous - compute, 0.0)  # rounding leaves -1e-17 where nobody waits
    steps = {
        "step_time": clock - previous,
        "compute_time": compute,
        "delay": injected,
        "comm_time": waited,
        "wait_time": waited,
        "loss": np.full_like(clock, np.nan),
        "stale": np.zeros_like(clock) if stale is None else stale,
        "clock": clock,
        "samples": scenario.batch_size * (1 - skipped),
        "skipped": skipped,
    }
    if age is None:
        age = np.zeros_like(clock)
    attrs = {
        "schema": SCHEMA,
        "kind": "simulated",
        "status": "complete",
        "algorithm": algorithm,
        "ranks": scenario.ranks,
        "group_size": options.get("group_size") or 0,
        "tau": options.get("tau", options.get("period", 0)),
        "imbalance": scenario.imbalance,
        "compute": "simulated",
        "compute_ms": scenario.compute_ms,
        "model": scenario.model,
        "dataset": "synthetic",
        "parameters": scenario.parameters,
        "batch_size": scenario.batch_size,
        "seed": scenario.seed,
        "steps_planned": scenario.steps,
        "steps_per_epoch": 0,
        "alpha_s": scenario.network.alpha,
        "beta_s_per_byte": scenario.network.beta,
        "activation_s": scenario.network.hop,
        "synchronization_s": scenario.network.synchronization,
        "collective": scenario.collective,
        "sync": options.get("sync", "none"),
        "mean_staleness": age_summary(age)[0],
        "config": json.dumps(
            {
                "algorithm": algorithm,
                "options": _jsonable(options),
                "scenario": {**asdict(scenario), "network": asdict(scenario.network)},
            }
        ),
    }
    tables = {} if stragglers is None else {"stragglers": stragglers}
    run = SimulatedRun("", attrs, steps, {}, {}, tables=tables, age=age, schedule=schedule)
    run.summary = summarize(run, skip)
    if stragglers is not None:
        run.summary.update(straggler_summary(stragglers))
    return run


def _jsonable(options):
    return {k: ({str(a): b for a, b in v.items()} if isinstance(v, dict) else v) for k, v in options.items()}


def save(run: SimulatedRun, path: str) -> str:
    """Write ``run`` to ``path`` (the schema of :mod:`wagma.results`, its
    ``sync/stragglers`` table and :func:`~wagma.results.summary.straggler_summary` included, plus
    ``sim/age`` ``[rank, step]``); returns the path."""
    write_run(path, run.attrs, {k: run.steps[k] for k in STEP_FIELDS if k in run.steps})
    with h5py.File(path, "a") as f:
        f.create_dataset("sim/age", data=run.age)
        f["sim/age"].attrs["meaning"] = (
            "steps between the step a rank's averaged contribution was computed "
            "at and the step it was averaged in (0: fresh)"
        )
        stragglers = run.tables.get("stragglers")
        if stragglers is not None:
            f.create_dataset("sync/stragglers", data=stragglers)
            f["sync/stragglers"].attrs["columns"] = json.dumps(list(STRAGGLER_COLUMNS))
            f["summary"].attrs.update(straggler_summary(stragglers))
    return path
