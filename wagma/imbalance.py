"""Load-imbalance models: who is slow at each step, by how much, the same on every rank.

A model is parsed from a spec string (the ``--imbalance`` option of
``experiments.train`` and of the simulator) and answers, for any step ``t``,
a vector of ``P`` seconds.  The draw for step ``t`` comes from a generator
seeded with ``(seed, t)`` alone, so every rank computes the same vector
without communicating, a resumed run draws what the uninterrupted run would
have drawn, and the simulator replays the exact delays of a measured run.

Two kinds (``Imbalance.kind``):

``"delay"``
    seconds added to a rank's compute time at that step:

    * ``random:k=2,ms=320`` - k ranks, chosen uniformly without replacement
      at every step, are each delayed ``ms`` (WAGMA-SGD section 5.2: two
      random ranks, 320 ms);
    * ``bernoulli:p=0.01,ms=1000`` - every rank stalls with probability p,
      independently at each step (the hierarchical-SGD post's emulation:
      1 % of steps, 1 s);
    * ``straggler:rank=0,ms=100`` - one rank is late by ``ms`` at every step
      (StragglAR's persistent straggler);
    * ``switching:every=50,ms=100`` - one rank is late by ``ms`` at every
      step, and which one changes every ``every`` steps: block b = t // every
      draws its rank uniformly from the seed and b alone (so it may draw the
      last block's rank again, with probability 1/P).

``"compute"``
    the compute time itself at that step (a real forward/backward pass is
    padded up to it; emulated compute sleeps exactly that long):

    * ``lognormal:median_ms=2000,sigma=1.0[,min_ms=..,max_ms=..]`` - heavy
      tailed, like the episode times of WAGMA's RL experiment (1.7 s to
      43.5 s, median under 2 s);
    * ``uniform:min_ms=10,max_ms=40``;
    * ``trace:PATH`` - times in ms from a file (``.npy``, or text with one
      row per step, whitespace- or comma-separated).  A 2-D trace
      ``(steps, ranks)`` is replayed: rank r at step t takes
      ``trace[t % steps, r % ranks]``.  A 1-D trace is an empirical
      distribution: every (step, rank) draws one of its values, seeded.

``none`` injects nothing (kind ``"delay"``, all zeros).
"""

import math
import os
import time
from collections.abc import Callable
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["FORMS", "Imbalance", "ImbalanceKind", "Injector", "parse_imbalance"]

# Separates the switching model's per-block draws from the per-step ones.
_SWITCHING = 0x5717

#: The accepted spec forms, for error messages and ``--help``.
FORMS = (
    "none",
    "random:k=K,ms=MS",
    "bernoulli:p=P,ms=MS",
    "straggler:rank=R,ms=MS",
    "switching:every=K,ms=MS",
    "lognormal:median_ms=MS,sigma=S[,min_ms=MS,max_ms=MS]",
    "uniform:min_ms=MS,max_ms=MS",
    "trace:PATH",
)


#: What an imbalance model draws, ``"delay"`` (added to compute) or ``"compute"`` (the compute time).
ImbalanceKind = Literal["delay", "compute"]


class Imbalance:
    """Per-step, per-rank seconds from one imbalance model.

    Attributes:
        spec: the spec string it was parsed from.
        kind: ``"delay"`` (added to compute) or ``"compute"`` (the compute time).
        ranks: P, the number of ranks it draws for.
        seed: the seed of every draw.
    """

    def __init__(
        self,
        spec: str,
        kind: ImbalanceKind,
        ranks: int,
        seed: int,
        draw: Callable[[np.random.Generator, int], ArrayLike],
    ) -> None:
        self.spec, self.kind, self.ranks, self.seed = spec, kind, ranks, seed
        self._draw = draw

    def seconds(self, step: int) -> np.ndarray:
        """The ``(P,)`` seconds of step ``step``; identical on every rank."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        rng = np.random.default_rng([self.seed, step])
        return np.asarray(self._draw(rng, step), dtype=np.float64)

    def table(self, steps: int, first: int = 0) -> np.ndarray:
        """Seconds of steps ``first .. first + steps - 1``, shape ``(steps, P)``."""
        return np.stack([self.seconds(t) for t in range(first, first + steps)]) if steps else np.zeros((0, self.ranks))

    def __repr__(self):
        return f"Imbalance({self.spec!r}, kind={self.kind!r}, ranks={self.ranks}, seed={self.seed})"


class Injector:
    """An imbalance model's slowness, injected into a training loop of one's own.

    ``injector(step)`` sleeps what the model draws for this rank at ``step``
    and returns the seconds it slept: a ``"delay"`` model's delay, or what a
    ``"compute"`` model's drawn compute time exceeds ``compute_s`` (the
    step's own measured compute, e.g. the previous step's; 0 emulates the
    whole step by sleeping).  Call it where the step's work begins, before
    the forward pass: a late rank then also starts its gradient
    communication late, as a slow device would.  Every rank draws the same
    table from ``(seed, step)`` without communicating, so the ranks agree
    on who is slow at each step, and the simulator replays the same draws.

    Args:
        spec: an imbalance spec (:data:`FORMS`), e.g. ``"random:k=2,ms=320"``.
        rank, ranks: this rank and the number of ranks.
        seed: the draws' seed.

    Raises:
        ValueError: a bad spec (the message lists the accepted forms); pure,
            so every rank raises it before any communication.

    Example::

        inject = Injector("random:k=1,ms=50", comm.rank, comm.size, seed=0)
        for step, (x, y) in enumerate(loader):
            delay = inject(step)
            ...
    """

    def __init__(self, spec: str, rank: int, ranks: int, seed: int = 0) -> None:
        self.model = parse_imbalance(spec, ranks, seed)
        if not isinstance(rank, int) or not 0 <= rank < ranks:
            raise ValueError(f"rank must be in range({ranks}), got {rank!r}")
        self.rank = rank

    def __call__(self, step: int, compute_s: float = 0.0) -> float:
        drawn = float(self.model.seconds(step)[self.rank])
        pause = drawn if self.model.kind == "delay" else max(0.0, drawn - compute_s)
        if pause > 0:
            time.sleep(pause)
        return pause


def _bad(spec, why):
    return ValueError(f"--imbalance {spec!r}: {why}; accepted forms: {', '.join(FORMS)}")


def _fields(spec, body, required, optional=()):
    """``k=2,ms=320`` as floats, checking the names."""
    fields = {}
    for item in filter(None, body.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise _bad(spec, f"expected name=value, got {item!r}")
        try:
            fields[key.strip()] = float(value)
        except ValueError:
            raise _bad(spec, f"{key.strip()} must be a number, got {value!r}") from None
    missing = [k for k in required if k not in fields]
    unknown = [k for k in fields if k not in (*required, *optional)]
    if missing or unknown:
        raise _bad(
            spec,
            f"needs {', '.join(required)}"
            + (f" (optional: {', '.join(optional)})" if optional else "")
            + (f"; missing {', '.join(missing)}" if missing else "")
            + (f"; unknown {', '.join(unknown)}" if unknown else ""),
        )
    return fields


def _ms(spec, fields, name, minimum=0.0):
    value = fields[name]
    if not math.isfinite(value) or value < minimum:
        raise _bad(spec, f"{name} must be a number >= {minimum:g}, got {value:g}")
    return value / 1e3


def _read_trace(spec, path):
    if not os.path.isfile(path):
        raise _bad(spec, f"trace file {path!r} does not exist")
    try:
        trace = (
            np.load(path)
            if path.endswith(".npy")
            else np.loadtxt(path, delimiter="," if path.endswith(".csv") else None, ndmin=1)
        )
    except (OSError, ValueError) as exc:
        raise _bad(spec, f"cannot read trace file {path!r}: {exc}") from None
    trace = np.asarray(trace, dtype=np.float64)
    if trace.ndim not in (1, 2) or trace.size == 0 or not np.all(np.isfinite(trace)) or np.any(trace < 0):
        raise _bad(
            spec,
            f"trace file {path!r} must hold a non-empty 1-D or 2-D array of times >= 0 in ms, got shape {trace.shape}",
        )
    return trace / 1e3


def parse_imbalance(spec: str, ranks: int, seed: int = 0) -> Imbalance:
    """The :class:`Imbalance` that ``spec`` names, for ``ranks`` ranks.

    Raises:
        ValueError: an unknown form, a missing or unknown field, a value out
            of range (k > P, rank >= P, p outside [0, 1], negative times), or
            an unreadable trace; the message names ``--imbalance`` and lists
            the accepted forms.  Pure and deterministic, so every rank raises
            the same error before any communication.
    """
    if not isinstance(spec, str):
        raise _bad(spec, "must be a string")
    if not isinstance(ranks, int) or ranks < 1:
        raise ValueError(f"ranks must be an int >= 1, got {ranks!r}")
    form, _, body = spec.strip().partition(":")
    if form == "none" and not body:
        zeros = np.zeros(ranks)
        return Imbalance(spec, "delay", ranks, seed, lambda rng, t: zeros)
    if form not in _FORMS:
        raise _bad(spec, f"unknown form {form!r}")
    return _FORMS[form](spec, body, ranks, seed)


def _random(spec: str, body: str, ranks: int, seed: int) -> Imbalance:
    f = _fields(spec, body, ("k", "ms"))
    k, delay = f["k"], _ms(spec, f, "ms")
    if k != int(k) or not 0 <= k <= ranks:
        raise _bad(spec, f"k must be an integer in [0, {ranks}] (the number of ranks), got {k:g}")

    def draw(rng, t):
        out = np.zeros(ranks)
        out[rng.choice(ranks, int(k), replace=False)] = delay
        return out

    return Imbalance(spec, "delay", ranks, seed, draw)


def _bernoulli(spec: str, body: str, ranks: int, seed: int) -> Imbalance:
    f = _fields(spec, body, ("p", "ms"))
    p, delay = f["p"], _ms(spec, f, "ms")
    if not 0 <= p <= 1:
        raise _bad(spec, f"p must be in [0, 1], got {p:g}")
    return Imbalance(spec, "delay", ranks, seed, lambda rng, t: (rng.random(ranks) < p) * delay)


def _straggler(spec: str, body: str, ranks: int, seed: int) -> Imbalance:
    f = _fields(spec, body, ("rank", "ms"))
    rank, delay = f["rank"], _ms(spec, f, "ms")
    if rank != int(rank) or not 0 <= rank < ranks:
        raise _bad(spec, f"rank must be an integer in [0, {ranks - 1}], got {rank:g}")
    late = np.zeros(ranks)
    late[int(rank)] = delay
    return Imbalance(spec, "delay", ranks, seed, lambda rng, t: late)


def _switching(spec: str, body: str, ranks: int, seed: int) -> Imbalance:
    f = _fields(spec, body, ("every", "ms"))
    every, delay = f["every"], _ms(spec, f, "ms")
    if every != int(every) or every < 1:
        raise _bad(spec, f"every must be an integer >= 1 (steps), got {every:g}")

    def draw(rng, t):
        out = np.zeros(ranks)
        # The block's own generator: the same rank for all its steps.
        out[np.random.default_rng([seed, _SWITCHING, t // int(every)]).integers(ranks)] = delay
        return out

    return Imbalance(spec, "delay", ranks, seed, draw)


def _lognormal(spec: str, body: str, ranks: int, seed: int) -> Imbalance:
    f = _fields(spec, body, ("median_ms", "sigma"), ("min_ms", "max_ms"))
    median = _ms(spec, f, "median_ms", minimum=1e-9)
    sigma = f["sigma"]
    if not sigma >= 0:
        raise _bad(spec, f"sigma must be >= 0, got {sigma:g}")
    lo = _ms(spec, f, "min_ms") if "min_ms" in f else 0.0
    hi = _ms(spec, f, "max_ms") if "max_ms" in f else math.inf
    if lo > hi:
        raise _bad(spec, f"min_ms must be <= max_ms, got {lo * 1e3:g} > {hi * 1e3:g}")
    return Imbalance(
        spec, "compute", ranks, seed, lambda rng, t: np.clip(rng.lognormal(math.log(median), sigma, ranks), lo, hi)
    )


def _uniform(spec: str, body: str, ranks: int, seed: int) -> Imbalance:
    f = _fields(spec, body, ("min_ms", "max_ms"))
    lo, hi = _ms(spec, f, "min_ms"), _ms(spec, f, "max_ms")
    if lo > hi:
        raise _bad(spec, f"min_ms must be <= max_ms, got {lo * 1e3:g} > {hi * 1e3:g}")
    return Imbalance(spec, "compute", ranks, seed, lambda rng, t: rng.uniform(lo, hi, ranks))


def _trace(spec: str, body: str, ranks: int, seed: int) -> Imbalance:
    if not body:  # ``trace:PATH`` without its PATH is no form at all
        raise _bad(spec, "unknown form 'trace'")
    trace = _read_trace(spec, body)
    if trace.ndim == 2:
        columns = np.arange(ranks) % trace.shape[1]
        return Imbalance(spec, "compute", ranks, seed, lambda rng, t: trace[t % trace.shape[0], columns])
    return Imbalance(spec, "compute", ranks, seed, lambda rng, t: trace[rng.integers(0, trace.size, ranks)])


#: Each form but ``none``: its parser, from the spec's body to the model.
_FORMS = {
    "random": _random,
    "bernoulli": _bernoulli,
    "straggler": _straggler,
    "switching": _switching,
    "lognormal": _lognormal,
    "uniform": _uniform,
    "trace": _trace,
}
