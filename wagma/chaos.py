"""A stream of failures at random times: ``experiments.train --chaos SPEC``, seeded.

Where ``--fault`` plans one failure at a chosen step, chaos draws a
failure process: the gaps between failures are exponential with mean
``mtbf`` seconds (a Poisson process, as failures of independent nodes
are), each failure strikes a row drawn uniformly from the run's rows, rank
0 included, and is of a kind drawn uniformly from ``kinds``:

``sigkill``, ``sigsegv``
    the process sends itself the signal, from a thread, wherever the main
    thread is (computing, inside a collective, between steps);
``exit``
    ``os._exit(0)`` from that thread: the process ends without MPI's
    knowledge (status 0, as ``--fault``'s exit, so that the launcher's exit
    status stays the survivors');
``stop``
    ``SIGSTOP``, for longer than any peer waits: a helper kills the stopped
    process (``SIGKILL``) after ``hang`` seconds, as a health check that
    finds a node unresponsive fences it;
``hang``
    the rank stops inside its step (in the optimizer's update, which every
    algorithm runs inside ``step()``, so that its peers wait for it at
    their next collective with it), and is killed after ``hang`` seconds,
    as a watchdog that finds a rank stuck past its deadline ends it.

The times are seconds of wall clock from the start of the first step
(rank 0's clock then, handed to all), so a run's failures are
reproducible from its seed, whatever the speed of its steps.  Each process watches its
own row only: a failure whose row is vacant (its rank died and was not
replaced) strikes nobody, and no failure strikes while only ``keep``
members are left.  A replacement (``--replace``) takes its row's failures
still to come.

The plan and its first events go to the run file (root attribute
``chaos``); the deaths themselves are its ``membership/`` rows, and each
strike is logged (``wagma.chaos``) just before it.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np

from .faults import DEATHS, die, signal_after_stop

if TYPE_CHECKING:
    import torch

__all__ = ["CHAOS_FORM", "CHAOS_KINDS", "ChaosMonkey", "ChaosPlan", "parse_chaos"]

logger = logging.getLogger(__name__)

#: The kinds of failure, in the order a spec's ``kinds`` defaults to.
CHAOS_KINDS = (*DEATHS, "stop", "hang")
#: The spec's form, for error messages and ``--help``.
CHAOS_FORM = "mtbf=SEC[,kinds=K+K...][,seed=N][,hang=SEC][,keep=N] (kinds: " + ", ".join(CHAOS_KINDS) + ")"
_RECORDED_EVENTS = 1000  # the plan's first events, in the run file


@dataclass(frozen=True)
class ChaosPlan:
    """A parsed ``--chaos`` spec for a run of ``rows`` ranks."""

    mtbf: float
    kinds: tuple[str, ...]
    seed: int
    #: Seconds a stopped or hung rank is left before it is killed.
    hang: float
    #: No failure strikes while this many members or fewer are left.
    keep: int
    rows: int

    def stream(self) -> Iterator[tuple[float, int, str]]:
        """The failures, ``(seconds from the start, row, kind)``, without
        end, the same for every process: each draws its gap, row and kind
        in turn from ``seed`` alone."""
        rng = np.random.default_rng(self.seed)
        at = 0.0
        while True:
            at += float(rng.exponential(self.mtbf))
            yield at, int(rng.integers(self.rows)), self.kinds[int(rng.integers(len(self.kinds)))]

    def events(self, count: int) -> list[tuple[float, int, str]]:
        """The first ``count`` failures of :meth:`stream`."""
        return list(itertools.islice(self.stream(), count))

    def record(self) -> str:
        """The run file's ``chaos`` attribute: the plan and its first events."""
        return json.dumps({**asdict(self), "events": self.events(_RECORDED_EVENTS)})


def parse_chaos(spec: str, rows: int, seed: int) -> ChaosPlan:
    """The plan ``spec`` names for a run of ``rows`` ranks; ``seed`` where
    the spec names none (the run's ``--seed``).

    Raises:
        ValueError: naming ``--chaos``, what is wrong and the accepted form:
            an unknown or repeated field, a missing ``mtbf``, a number that is
            not one or not above zero, an unknown kind, ``keep`` not in
            [1, rows - 1].  Pure: every rank raises the same before any message.
    """

    def bad(why):
        return ValueError(f"--chaos {spec!r}: {why}; accepted form: {CHAOS_FORM}")

    fields: dict[str, str] = {}
    for item in spec.split(","):
        name, eq, value = item.strip().partition("=")
        if not eq or name not in ("mtbf", "kinds", "seed", "hang", "keep"):
            raise bad(f"{item.strip()!r} is not NAME=VALUE with NAME one of mtbf, kinds, seed, hang, keep")
        if name in fields:
            raise bad(f"{name} is given twice")
        fields[name] = value
    if "mtbf" not in fields:
        raise bad("mtbf (the mean seconds between failures) is required")

    def positive(name, default):
        try:
            value = float(fields.get(name, default))
        except ValueError:
            raise bad(f"{name} must be a number of seconds, got {fields[name]!r}") from None
        if not (value > 0 and math.isfinite(value)):
            raise bad(f"{name} must be above zero, got {fields[name]!r}")
        return value

    kinds = tuple(fields.get("kinds", "+".join(CHAOS_KINDS)).split("+"))
    unknown = [k for k in kinds if k not in CHAOS_KINDS]
    if unknown or len(set(kinds)) != len(kinds):
        raise bad(f"kinds must be distinct names of {', '.join(CHAOS_KINDS)} joined by +, got {fields['kinds']!r}")
    integers = {}
    for name, default in (("seed", seed), ("keep", 1)):
        try:
            integers[name] = int(fields.get(name, default))
        except ValueError:
            raise bad(f"{name} must be an integer, got {fields[name]!r}") from None
    if not 1 <= integers["keep"] < rows:
        raise bad(f"keep must be in [1, {rows - 1}] (this run has {rows} ranks), got {integers['keep']}")
    return ChaosPlan(positive("mtbf", None), kinds, integers["seed"], positive("hang", 5.0), integers["keep"], rows)


class ChaosMonkey:
    """This process's share of a :class:`ChaosPlan`: a daemon thread that
    sleeps until each failure of row ``row`` and strikes, unless only
    ``keep`` members are left (``members()``: the count alive, which the
    trainer takes as its communicator less the dead MPI knows of).

    :meth:`start` takes the plan's time zero (wall clock, the same on
    every rank); failures before the moment it is called (a replacement's
    predecessor's) are passed over."""

    def __init__(self, plan: ChaosPlan, row: int, members: Callable[[], int]) -> None:
        self.plan, self.row, self.members = plan, row, members
        self.start_time = math.nan
        self._hang, self._stopped = threading.Event(), threading.Event()
        #: This row's failures that came while only ``keep`` members were left, and struck nobody.
        self.spared = 0

    def start(self, optimizer: torch.optim.Optimizer, zero: float) -> None:
        """Strike from now on, on the plan's clock from ``zero`` (seconds
        since the epoch); a ``hang`` stops the main thread in ``optimizer``'s
        step pre-hook."""
        self.start_time = zero
        optimizer.register_step_pre_hook(self._stop_here_if_hung)
        threading.Thread(target=self._run, name=f"chaos-row-{self.row}", daemon=True).start()

    def stop(self) -> None:
        """No more failures: the run's steps are over (its file is being closed)."""
        self._stopped.set()

    def _stop_here_if_hung(self, *_):
        if self._hang.is_set():
            threading.Event().wait()  # for ever: the chaos thread kills the process

    def _run(self):
        for at, row, kind in self.plan.stream():
            at += self.start_time
            if row != self.row or at <= time.time():
                continue
            if self._stopped.wait(at - time.time()):
                return
            if self.members() > self.plan.keep:
                self._strike(kind)  # does not return
            else:
                self.spared += 1

    def _strike(self, kind: str) -> None:
        logger.warning("striking row %d: %s, %.2f s into the run", self.row, kind, time.time() - self.start_time)
        for handler in logging.getLogger().handlers:
            handler.flush()
        pid = os.getpid()
        if kind in DEATHS:
            die(kind)
        elif kind == "stop":
            signal_after_stop(pid, self.plan.hang, signal.SIGKILL)
            os.kill(pid, signal.SIGSTOP)
        else:  # hang: the main thread stops at its next update, inside the step; it is killed after hang seconds
            self._hang.set()
            time.sleep(self.plan.hang)
            os.kill(pid, signal.SIGKILL)
