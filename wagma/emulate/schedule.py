"""Who contributed what to each averaging of a run: what the emulator replays."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from collectives.gossip import active_ranks
from wagma.options import AlgorithmName, resolved_options

if TYPE_CHECKING:
    from wagma.results import Run
    from wagma.sim import Scenario, SimulatedRun

__all__ = ["Schedule", "exchanges_from_times", "logged_schedule", "simulated_schedule"]

#: The arrays each algorithm's schedule needs (beyond the timing of every
#: run): WAGMA-SGD's ``source`` (the iteration of the contribution each rank
#: gave to each version), eager-SGD's ``taken`` (the version that read each
#: rank's gradient of each step, -1 where none did), AD-PSGD's
#: ``exchanges`` (one row per exchange and side, in each rank's order:
#: rank, peer, active, copied_after, applied_after, as
#: :attr:`collectives.gossip.PairwiseGossip.log` and the run file's table
#: ``sync/exchanges`` hold them).  The synchronous algorithms need none:
#: their arithmetic does not depend on the times.
NEEDS = {
    "wagma": ("source",),  # with wait_avoiding
    "eager_sgd": ("taken",),
    "adpsgd": ("exchanges",),
}


@dataclass(frozen=True)
class Schedule:
    """The order of a run's contributions, for :class:`~wagma.emulate.emulator.Emulator`."""

    #: The algorithm's name (:func:`wagma.algorithms.create`'s).
    algorithm: str
    #: Its options, resolved for ``ranks`` (``"auto"`` made concrete).
    options: dict[str, Any]
    #: P.
    ranks: int
    #: T.
    steps: int
    #: :data:`NEEDS` of the algorithm, ``[P, T]`` each
    #: (``exchanges``: ``[rows, 5]``).
    arrays: dict[str, np.ndarray]
    #: ``[P, T]`` seconds on the training clock when each rank
    #: ended each step (the time axis of the emulated run).
    clock: np.ndarray
    #: Where the schedule comes from, for the run file.
    origin: str
    #: The simulated run it was read from (None for a logged one).
    run: SimulatedRun | None = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        needs = NEEDS.get(self.algorithm, ())
        if self.algorithm == "wagma" and not self.options.get("wait_avoiding"):
            needs = ()  # blocking groups, or none: nobody is ever stale
        missing = [name for name in needs if name not in self.arrays]
        if missing:
            raise ValueError(f"a schedule of {self.algorithm} needs {', '.join(missing)}")

    @property
    def stale(self) -> np.ndarray:
        """``[P, T]``, 1 where rank r's step-t contribution was not in version t
        (WAGMA-SGD, eager-SGD); zeros for the others."""
        if self.algorithm == "wagma" and "source" in self.arrays:
            return (self.arrays["source"] != np.arange(self.steps)).astype(float)
        if self.algorithm == "eager_sgd":
            return (self.arrays["taken"] != np.arange(self.steps)).astype(float)
        return np.zeros((self.ranks, self.steps))


def simulated_schedule(algorithm: AlgorithmName, scenario: Scenario, **options: Any) -> Schedule:
    """The schedule of ``algorithm`` in a :class:`wagma.sim.engine.Scenario`: the
    simulator's times decide who was fresh (a core or GPU per rank, the
    scenario's imbalance and network).  Raises ValueError as
    :func:`wagma.sim.engine.simulate` does."""
    from wagma.sim import simulate  # numba compiles the kernels: only when a schedule is asked for

    run = simulate(algorithm, scenario, **options)
    arrays = dict(run.schedule)
    if algorithm == "adpsgd":
        arrays = {
            "exchanges": exchanges_from_times(
                arrays["partner"], arrays["begin"], arrays["finish"], arrays["exchange_s"]
            )
        }
    return Schedule(
        algorithm,
        resolved_options(algorithm, scenario.ranks, options).as_dict(),
        scenario.ranks,
        scenario.steps,
        arrays,
        np.asarray(run.steps["clock"]),
        f"simulated: {scenario!r}",
        run,
    )


def exchanges_from_times(partner: np.ndarray, begin: np.ndarray, finish: np.ndarray, exchange_s: float) -> np.ndarray:
    """AD-PSGD's exchange table (:data:`NEEDS`) from the simulator's times
    (:func:`wagma.sim.kernels.adpsgd`): the exchange that active rank a
    asked for after step k, with ``partner[a, k]``, begins at ``begin[a, k]``;
    a rank's update of step k ends at ``finish[r, k]``, where it folds the
    differences pending.  Reading chosen (the runtime's order of events):
    the active side copies its model when the exchange begins and adds its
    half difference when it ends (``exchange_s`` later); the passive side
    does both when the request arrives (half of it).  An update at the
    same time as a copy comes first."""
    ranks, steps = finish.shape
    rows = []  # (rank, time, peer, active, copied_after, applied_after)
    for a in active_ranks(ranks) if ranks > 1 else ():
        for k in range(steps):
            p, b = int(partner[a, k]), float(begin[a, k])
            arrived, done = b + exchange_s / 2, b + exchange_s
            rows.append(
                (
                    a,
                    b,
                    p,
                    1,
                    np.searchsorted(finish[a], b, side="right"),
                    np.searchsorted(finish[a], done, side="right"),
                )
            )
            served = np.searchsorted(finish[p], arrived, side="right")
            rows.append((p, arrived, a, 0, served, served))
    rows.sort(key=lambda row: row[:3])
    return np.array([(r, peer, active, c, d) for r, _, peer, active, c, d in rows], dtype=np.int64).reshape(-1, 5)


def logged_schedule(run: Run) -> Schedule:
    """The schedule a measured run logged: its step field ``contribution``
    (:attr:`wagma.algorithms.base.Algorithm.contribution`, each rank's iteration
    at each step) read back into ``source`` (WAGMA-SGD) or ``taken``
    (eager-SGD: under ``"drop"`` a version took the step's own gradient
    where the contribution was that step's; under ``"newest"`` the one of
    the iteration logged; under ``"accumulate"`` every gradient after the
    one the rank's previous read ended at, up to the iteration logged).
    ``run`` is a :class:`wagma.results.reader.Run` of ``experiments.train`` or
    :class:`wagma.step_recorder.StepRecorder`; AD-PSGD's exchanges come
    from its table ``sync/exchanges``.  Raises ValueError for a run that did
    not log what its algorithm's replay needs, or that reallocates work."""
    algorithm = run.attrs["algorithm"]
    options = json.loads(run.attrs["config"]).get("algorithm_options", {})
    ranks, steps = np.shape(run.steps["clock"])
    logged = np.asarray(run.steps["contribution"])
    arrays = {}
    if algorithm == "adpsgd":
        if "exchanges" not in run.tables:
            raise ValueError(
                f"{run.path}: an AD-PSGD run without its exchanges (table sync/exchanges: close "
                f"the algorithm before the recorder; files of an earlier version lack it)"
            )
        arrays["exchanges"] = np.asarray(run.tables["exchanges"], dtype=np.int64)
    if options.get("reallocate"):
        raise ValueError(
            f"{run.path}: a run that reallocates work (reallocate=True) changes its batches "
            f"from period to period, which the emulator does not replay"
        )
    if algorithm in ("wagma", "eager_sgd") and (algorithm == "eager_sgd" or options.get("wait_avoiding")):
        if not np.isfinite(logged).all():
            raise ValueError(
                f"{run.path}: {algorithm} run without its contributions logged at every step "
                f"(step field 'contribution'; files of an earlier version lack it)"
            )
        logged = logged.astype(np.int64)
        if algorithm == "wagma":
            arrays["source"] = logged
        else:
            arrays["taken"] = _taken_from_log(logged, options.get("late", "drop"))
    return Schedule(
        algorithm,
        resolved_options(algorithm, ranks, options).as_dict(),
        ranks,
        steps,
        arrays,
        np.asarray(run.steps["clock"]),
        f"logged: {run.path}",
    )


def _taken_from_log(logged, late):
    """eager-SGD's ``taken[P, T]`` from each version's logged contribution iteration."""
    ranks, steps = logged.shape
    taken = np.full((ranks, steps), -1, dtype=np.int64)
    for r in range(ranks):
        read_up_to = -1
        for v in range(steps):
            c = logged[r, v]
            if c < 0:
                continue
            if late == "accumulate":
                taken[r, read_up_to + 1 : c + 1] = v
            else:
                taken[r, c] = v
            read_up_to = c
    return taken
