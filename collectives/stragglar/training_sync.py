"""Global synchronizations run as StragglAR with the rank predicted to arrive last.

:class:`PredictedStragglerSync` is the piece between a training algorithm
and StragglAR (Devraj et al.): the algorithm tells it when a global
synchronization begins (with this rank's arrival, see below), hands it the
buffers to reduce over all ranks, and tells it when the synchronization
ends.  Each synchronization then runs as:

* **StragglAR with straggler p** when
  :class:`~collectives.stragglar.prediction.StragglerPredictor` predicts rank p with confidence (the others
  reduce-scatter while p is late; the schedule's n + ceil(log2 n) - 2
  rounds follow its arrival, :mod:`collectives.stragglar.runtime`);
* **the allreduce** (:func:`collectives.schedules.blocking.allreduce`, tuned ``auto``, or
  whatever ``fallback`` the algorithm passes) while no rank is predicted,
  and for a buffer whose shape was not among the templates.

The generator has a schedule for every n >= 2, odd n included
(:mod:`collectives.stragglar.generator`), so no rank count falls back.

**Correctness never depends on the prediction.**  StragglAR reduces every
chunk exactly once whoever arrives last; only its time depends on it.  When
the predicted rank p is not the last to arrive, the really late rank is one
of the n - 1 ranks of the ReduceScatter, so the ReduceScatter starts only
when it arrives, and the rounds follow: the synchronization takes the delay
plus ReduceScatter plus rounds, nothing hidden - at n = 8 that is
(6/7 + 9/7) s beta against the ring's 2 (7/8) s beta, about 1.2x the ring.
The result differs from the allreduce's only by the order of the float
additions (tests bound it by float32 reassociation).

**Arrival and agreement without a round trip.**  A rank's arrival is the
seconds from its return from the last synchronization to its entry into
this one, on its own clock (the first: since construction), as
:mod:`collectives.stragglar.prediction` defines it.  :meth:`~PredictedStragglerSync.begin` starts a
nonblocking allgather of it on the control channel and the data moves at once;
:meth:`~PredictedStragglerSync.end` completes the
allgather - by then every rank has entered, so it costs no wait on the
critical path - and feeds the same vector to the same predictor on every
rank, which therefore holds the same prediction for the next
synchronization without exchanging it.  The StragglAR plan for a new
prediction (its schedule, verified, and the non-stragglers' communicator)
is built in :meth:`~PredictedStragglerSync.end` too, while all ranks are together, not at the next
synchronization where the straggler is late.  Plans are kept for the last
``cached_plans`` predicted stragglers.

**Worth hiding.**  A rank that is last by a hair gains nothing from
StragglAR: its ReduceScatter and rounds cost more than the fallback unless
the straggler's lead covers part of them.  With the straggler ``L``
seconds after the others, StragglAR ends ``max(RS, L) + rounds`` after
their arrival and the fallback ``L + F``, where ``F`` is what the fallback
still has to do once the last rank is there.  So the predictor's
``min_lead_s`` is set before every prediction to ``RS + rounds - F``, or
to infinity where ``rounds >= F``
(:func:`~collectives.stragglar.cost.stragglar_min_lead`).  ``F`` is
measured online at the fallback synchronizations on the rank that arrived
last (it did not wait), from its arrival; so is ``T``, the whole
allreduce's time, from the start of its reduction.  For local SGD and
WAGMA they are the same; Allreduce-SGD's buckets start during backward
(``reduction_started`` of :meth:`~PredictedStragglerSync.begin`), so its
``F`` is the tail that backward did not hide.

``RS`` and ``rounds`` are measured too, once StragglAR has run for a
rank that did arrive last: the non-stragglers time their ReduceScatter
(the fastest of them, the last to enter it, waited for no one), and the
straggler its time from entry to return, ``A = max(RS - L, 0) + rounds``
at its lead ``L``, so ``rounds = A - max(RS - L, 0)``.  Before that the
gate takes Table 1's bandwidth terms: ``RS + rounds = (1 + b) T`` with
``b`` :func:`~collectives.stragglar.cost.break_even_lead` (n) (1/3 at n =
4, 0.22 at n = 8, never at n = 3).  The rounds are measured, not derived
from the ReduceScatter's steps, because they run when the straggler
arrives, after the others have been waiting: on a node with fewer cores
than ranks, the waiting ranks' polling takes the cores from the rounds'
Python loop (8 ranks on 2 cores, 4 KiB: 9 rounds in 1.05 ms, 0.12 ms
each, after 6 ReduceScatter steps in 0.26 ms, 0.04 ms each).  The
measured rounds are StragglAR's small-message rule: for a small buffer
they are n + ceil(log2 n) - 2
message latencies of a Python loop against the library's log2 n inside
one call, they take longer than the whole fallback, the gate turns
infinite, and every later synchronization runs the fallback, however late
the straggler.  For large buffers the rounds are below ``F`` (at n = 8,
9/7 s beta against the ring's 7/4) and the gate is the lead that the
ReduceScatter needs.  Under the WAGMA paper's random-k
imbalance, where the two late ranks are late by the same delay, no rank
leads and none is predicted; a persistent straggler leads by its delay
and is.

Every synchronization is logged: :attr:`PredictedStragglerSync.log` rows of
``(sync, predicted, last, lead_s, min_lead_s)`` (predicted -1: the
allreduce ran).
"""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from ..buffers import Buffer, BufferT, describe
from ..compression.allreduce import Compressor, compressed_allreduce
from ..failures import wait
from ..schedules.blocking import Op, allreduce, allreduce_init
from .cost import break_even_lead, stragglar_min_lead
from .generator import lower_bound
from .prediction import StragglerPredictor
from .runtime import StragglerAwareAllreduce

if TYPE_CHECKING:
    from mpi4py import MPI
    from typing_extensions import Self  # typing.Self is Python 3.11's

    from ..comm import Communicator

__all__ = ["PredictedStragglerSync"]

_Buffers = TypeVar("_Buffers", bound=Iterable[Buffer])


class PredictedStragglerSync:
    """Straggler-predicting global synchronizations over one communicator.

    Collective: every rank constructs it, calls :meth:`begin`, the same
    :meth:`reduce` calls (buffers of the same element counts and dtypes)
    and :meth:`end` in the same order, and :meth:`close`.

    Args:
        comm: a :class:`~collectives.comm.Communicator`.
        templates: the buffers (numpy arrays or torch tensors) whose element
            counts and dtypes the synchronizations reduce; a predicted
            straggler gets a StragglAR plan for each (a buffer of another
            shape is reduced by the fallback).
        op: ``"sum"`` or ``"avg"``.
        fallback: ``callable(buffer)`` reducing over all ranks in place
            while no rank is predicted (default: ``allreduce(buffer,
            comm=comm, op=op)``, the templates themselves bound once by
            :func:`~collectives.schedules.blocking.allreduce_init`, so that
            ``auto`` costs what the library's call costs).
        cached_plans: the predicted stragglers whose StragglAR plans are
            kept (one plan per template shape; each plan holds a
            communicator of the other ranks).
        **predictor: ``decay`` and ``confidence`` of
            :class:`~collectives.stragglar.prediction.StragglerPredictor`
            (``min_lead_s`` is set as the module says).

    Attributes:
        predictor: the :class:`~collectives.stragglar.prediction.StragglerPredictor`.
        log: one ``(sync, predicted, last, lead_s, min_lead_s)`` row per
            synchronization (``min_lead_s``: the lead the prediction made
            after it required).
        allreduce_s, tail_s: ``T`` and ``F`` of the module's gate, as last
            measured (NaN before).
        reduce_scatter_s, rounds_s: ``RS`` and ``rounds`` of the
            module's gate, as last measured (NaN before StragglAR has run
            for a rank that arrived last).
    """

    #: Column names of :attr:`log`'s rows.
    COLUMNS = ("sync", "predicted", "last", "lead_s", "min_lead_s")

    def __init__(
        self,
        comm: Communicator,
        templates: Iterable[Buffer],
        *,
        op: Op = "avg",
        fallback: Callable[[Buffer], object] | None = None,
        cached_plans: int = 4,
        **predictor: float,
    ) -> None:
        if isinstance(cached_plans, bool) or not isinstance(cached_plans, int) or cached_plans < 1:
            raise ValueError(f"cached_plans must be an int >= 1, got {cached_plans!r}")
        self.comm, self.op = comm, op
        templates = list(templates)
        self.predictor = StragglerPredictor(comm.size, **predictor)
        self._fallback = fallback or (lambda buf: allreduce(buf, comm=comm, op=op, check=False))
        # The default fallback on the templates themselves: checked and resolved once (allreduce_init).
        # Whether a buffer is a template is each rank's own view, but both paths send the same
        # messages: neither agrees per call, and both resolve auto alike (one comm, one table).
        self._bound = {} if fallback else {id(t): allreduce_init(t, comm=comm, op=op) for t in templates}
        self._plans: OrderedDict[tuple[int | None, int, str], StragglerAwareAllreduce] = OrderedDict()
        self._templates: dict[tuple[int, str], Buffer] = {}  # (numel, dtype) -> a buffer of that shape
        for template in templates:
            info = describe(template)
            self._templates.setdefault((info.numel, info.dtype), template)
        self._cached = cached_plans * max(1, len(self._templates))
        self._break_even = break_even_lead(comm.size, lower_bound(comm.size)) if comm.size > 1 else 0.0
        self.allreduce_s = self.tail_s = self.reduce_scatter_s = self.rounds_s = float("nan")
        self._reduce_s = (float("nan"),) * 2  # this rank's T and F at its last fallback synchronization
        # Its ReduceScatter (summed over the buffers) and its time from entry, at the last synchronization
        # if it ran StragglAR.
        self._stragglar_s = (float("nan"),) * 2
        self._reduce_scatter_sum = 0.0
        self._mine = np.zeros(5)
        self._received = np.zeros((comm.size, 5))
        self._request: MPI.Request | None = None
        self._planned_for: int | None = None
        self._ran_stragglar = False
        self.log: list[tuple[int, int, int, float, float]] = []
        self._left = time.perf_counter()

    @property
    def straggler(self) -> int | None:
        """The rank the next synchronization plans for, or None."""
        return self.predictor.straggler

    def begin(self, arrival_s: float | None = None, reduction_started: float | None = None) -> None:
        """A synchronization begins: this rank's arrival goes out
        (nonblocking).  ``arrival_s`` overrides the measured one (seconds
        since the last :meth:`end`) - for tests and replayed traces;
        ``reduction_started``: the ``time.perf_counter()`` at which the
        caller's own fallback reduction started before this call (buckets
        launched during backward)."""
        if self._request is not None:
            raise RuntimeError("begin() twice without end()")
        entered = time.perf_counter()
        self._mine[:] = entered - self._left if arrival_s is None else arrival_s, *self._reduce_s, *self._stragglar_s
        self._reduce_scatter_sum = 0.0
        self._started = entered if reduction_started is None else min(reduction_started, entered)
        self._request = self.comm.control.Iallgather(self._mine, self._received)
        self._planned_for = self.straggler
        self._ran_stragglar = self._planned_for is not None
        self._began = entered

    def reduce(self, buffer: BufferT, compressor: Compressor | None = None) -> BufferT:
        """Reduce ``buffer`` over all ranks in place: StragglAR with the
        predicted straggler if there is one, else the fallback; with
        ``compressor`` (the buffer's compressed stream) StragglAR's
        compressed rounds, else the compressed allreduce
        (:mod:`collectives.compression`)."""
        if self._request is None:
            raise RuntimeError("reduce() outside begin() ... end()")
        info = describe(buffer)
        key = (self.straggler, info.numel, info.dtype)
        plan = self._plans.get(key)
        if plan is None:  # no prediction, or a buffer shape not planned for
            bound = self._bound.get(id(buffer))
            if compressor is not None:
                compressed_allreduce(buffer, comm=self.comm, compressor=compressor, op=self.op)
            elif bound is not None and bound.data is buffer:
                bound()
            else:
                self._fallback(buffer)
            self._ran_stragglar = False
        else:
            self._plans.move_to_end(key)
            plan(buffer, check=False, compressor=compressor)
            if plan.peers is not None:  # a non-straggler
                self._reduce_scatter_sum += plan.reduce_scatter_s
        return buffer

    def end(self) -> None:
        """The synchronization ends: every rank's arrival in, the predictor
        updated (the same on every rank), the next one's plans built."""
        reduced = time.perf_counter()
        assert self._request is not None, "end() without begin()"
        wait(self._request)
        self._request = None
        arrivals = self._received[:, 0]
        # T and F of the rank that arrived last at the previous
        # synchronization, if the fallback ran there (it did not wait).
        if self.log and self.log[-1][1] < 0 and np.all(np.isfinite(self._received[int(self.log[-1][2]), 1:3])):
            self.allreduce_s, self.tail_s = map(float, self._received[int(self.log[-1][2]), 1:3])
        # RS and the rounds, if StragglAR ran at the previous synchronization for the rank that came last.
        if self.log and self.log[-1][1] >= 0 and self.log[-1][1] == self.log[-1][2]:
            straggler, lead = int(self.log[-1][1]), self.log[-1][3]
            reduce_scatters, entry_to_return = self._received[:, 3], self._received[straggler, 4]
            reduce_scatters = reduce_scatters[np.isfinite(reduce_scatters)]
            if reduce_scatters.size and np.isfinite(entry_to_return):
                self.reduce_scatter_s = float(reduce_scatters.min())
                self.rounds_s = max(0.0, float(entry_to_return) - max(0.0, self.reduce_scatter_s - lead))
        if np.isfinite(self.rounds_s) and np.isfinite(self.tail_s):
            self.predictor.min_lead_s = stragglar_min_lead(self.reduce_scatter_s, self.rounds_s, self.tail_s)
        elif np.isfinite(self.allreduce_s):
            gate = (1 + self._break_even) * self.allreduce_s - self.tail_s
            self.predictor.min_lead_s = max(0.0, gate) if np.isfinite(gate) else np.inf
        predicted, last, lead = self.predictor.observe(arrivals)
        self.log.append(
            (len(self.log), predicted if self._ran_stragglar else -1, last, lead, self.predictor.min_lead_s)
        )
        if self._ran_stragglar:
            mine = self._reduce_scatter_sum if self.comm.rank != self._planned_for else float("nan")
            self._stragglar_s = (mine, reduced - self._began)
        else:
            self._reduce_s = (reduced - self._started, reduced - self._began)
            self._stragglar_s = (float("nan"),) * 2
        if self.straggler is not None:
            for (numel, dtype), template in self._templates.items():
                self._plan((self.straggler, numel, dtype), template)
        self._left = time.perf_counter()

    def _plan(self, key, template):
        if key in self._plans:
            return
        while len(self._plans) >= self._cached:  # the same eviction on every rank
            _, old = self._plans.popitem(last=False)
            old.close()
        self._plans[key] = StragglerAwareAllreduce(self.comm, key[0], template, op=self.op)

    def __call__(
        self,
        buffers: _Buffers,
        arrival_s: float | None = None,
        compressors: Sequence[Compressor | None] | None = None,
    ) -> _Buffers:
        """One whole synchronization of ``buffers``: begin, reduce each
        (through its compressor of ``compressors``, where given), end."""
        self.begin(arrival_s)
        for buffer, compressor in zip(buffers, compressors or itertools.repeat(None)):
            self.reduce(buffer, compressor)
        self.end()
        return buffers

    def rows(self) -> np.ndarray:
        """:attr:`log` as a float array, columns :attr:`COLUMNS`."""
        return np.asarray(self.log, dtype=np.float64).reshape(-1, len(self.COLUMNS))

    def close(self) -> None:
        """Free the plans (collective)."""
        while self._plans:
            self._plans.popitem(last=False)[1].close()

    def __enter__(self) -> "Self":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PredictedStragglerSync(n={self.comm.size}, op={self.op}, {self.predictor!r})"
