"""Who contributed what to each averaging of a run: what the emulator replays."""

from dataclasses import dataclass, field

import json

import numpy as np

from wagma.options import resolved_options

__all__ = ["Schedule", "logged_schedule", "simulated_schedule"]

#: The arrays each algorithm's schedule needs (beyond the timing of every
#: run): WAGMA-SGD's ``source`` (the iteration of the contribution each rank
#: gave to each version), eager-SGD's ``taken`` (the version that read each
#: rank's gradient of each step, -1 where none did), AD-PSGD's exchanges
#: (``partner`` and ``begin`` of each active rank's step, ``start`` and
#: ``finish`` of every rank's steps, ``exchange_s``).  The synchronous
#: algorithms need none: their arithmetic does not depend on the times.
NEEDS = {"wagma": ("source",),     # with wait_avoiding "eager_sgd": ("taken",),
         "adpsgd": ("partner", "begin", "start", "finish", "exchange_s")}


@dataclass(frozen=True)
class Schedule:
    """The order of a run's contributions, for :class:`~wagma.emulate.Emulator`.

    Attributes:
        algorithm: the algorithm's name (:func:`wagma.algorithms.create`'s).
        options: its options, resolved for ``ranks`` (``"auto"`` made concrete).
        ranks, steps: P and T.
        arrays: :data:`NEEDS` of the algorithm, ``[P, T]`` each (``exchange_s``
            a number).
        clock: ``[P, T]`` seconds on the training clock when each rank
            ended each step (the time axis of the emulated run).
        origin: where the schedule comes from, for the run file.
        run: the simulated run it was read from (None for a logged one).
    """

    algorithm: str
    options: dict
    ranks: int
    steps: int
    arrays: dict
    clock: np.ndarray
    origin: str
    run: object = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        needs = NEEDS.get(self.algorithm, ())
        if self.algorithm == "wagma" and not self.options.get("wait_avoiding"):
            needs = ()          # blocking groups, or none: nobody is ever stale
        missing = [name for name in needs if name not in self.arrays]
        if missing:
            raise ValueError(f"a schedule of {self.algorithm} needs {', '.join(missing)}")

    @property
    def stale(self) -> np.ndarray:
        """``[P, T]``: 1 where rank r's step-t contribution was not in version t
        (WAGMA-SGD, eager-SGD); zeros for the others."""
        if self.algorithm == "wagma" and "source" in self.arrays:
            return (self.arrays["source"] != np.arange(self.steps)).astype(float)
        if self.algorithm == "eager_sgd":
            return (self.arrays["taken"] != np.arange(self.steps)).astype(float)
        return np.zeros((self.ranks, self.steps))


def simulated_schedule(algorithm: str, scenario, **options) -> Schedule:
    """The schedule of ``algorithm`` in a :class:`wagma.sim.Scenario`: the
    simulator's times decide who was fresh (a core or GPU per rank, the
    scenario's imbalance and network).  Raises ValueError as
    :func:`wagma.sim.simulate` does."""
    from wagma.sim import simulate       # numba compiles the kernels: only when a schedule is asked for

    run = simulate(algorithm, scenario, **options)
    arrays = dict(run.schedule)
    if algorithm == "adpsgd":
        arrays["start"] = arrays["finish"] - run.steps["compute_time"]
    return Schedule(algorithm, resolved_options(algorithm, scenario.ranks, options).as_dict(), scenario.ranks,
                    scenario.steps, arrays, np.asarray(run.steps["clock"]), f"simulated: {scenario!r}", run)


def logged_schedule(run) -> Schedule:
    """The schedule a measured run logged: its step field ``contribution``
    (:attr:`wagma.algorithms.Algorithm.contribution`, each rank's iteration
    at each step) read back into ``source`` (WAGMA-SGD) or ``taken``
    (eager-SGD: under ``"drop"`` a version took the step's own gradient
    where the contribution was that step's; under ``"newest"`` the one of
    the iteration logged; under ``"accumulate"`` every gradient after the
    one the rank's previous read ended at, up to the iteration logged).
    ``run`` is a :class:`wagma.results.Run` of ``experiments.train`` or
    :class:`wagma.step_recorder.StepRecorder`.  Raises ValueError for a run
    of an algorithm whose order the file does not hold (AD-PSGD) or that
    did not log its contributions."""
    algorithm = run.attrs["algorithm"]
    options = json.loads(run.attrs["config"]).get("algorithm_options", {})
    ranks, steps = np.shape(run.steps["clock"])
    logged = np.asarray(run.steps["contribution"])
    arrays = {}
    if algorithm == "adpsgd":
        raise ValueError(f"{run.path}: an AD-PSGD run does not log the order of its exchanges; "
                         f"its schedule comes from the simulator (simulated_schedule)")
    if options.get("reallocate"):
        raise ValueError(f"{run.path}: a run that reallocates work (reallocate=True) changes its batches "
                         f"from period to period, which the emulator does not replay")
    if algorithm in ("wagma", "eager_sgd") and (algorithm == "eager_sgd" or options.get("wait_avoiding")):
        if not np.isfinite(logged).all():
            raise ValueError(f"{run.path}: {algorithm} run without its contributions logged at every step "
                             f"(step field 'contribution'; files of an earlier version lack it)")
        logged = logged.astype(np.int64)
        if algorithm == "wagma":
            arrays["source"] = logged
        else:
            arrays["taken"] = _taken_from_log(logged, options.get("late", "drop"))
    return Schedule(algorithm, resolved_options(algorithm, ranks, options).as_dict(), ranks, steps, arrays,
                    np.asarray(run.steps["clock"]), f"logged: {run.path}")


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
                taken[r, read_up_to + 1:c + 1] = v
            else:
                taken[r, c] = v
            read_up_to = c
    return taken
