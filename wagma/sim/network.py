"""What communication costs in the simulator: the alpha-beta model.

A message of ``s`` bytes between two ranks takes ``alpha + s * beta``
seconds; a rank sends one message at a time and concurrent pairs do not
share links (the model of the StragglAR paper's Table 1 and of WAGMA's
section 3.3).  The collectives are costed with the formulas of
:mod:`collectives.stragglar.cost` and pick their schedule by the same rule
as the runtime (:func:`collectives.schedules.blocking.choose_allreduce`,
:func:`collectives.wait_avoiding.group_allreduce.choose_group_allreduce`), so a
simulated run costs what the code it stands for would send.
"""

import math
from dataclasses import dataclass, replace
from typing import Literal, TypeAlias, get_args

import numpy as np

from collectives.schedules.blocking import choose_allreduce
from collectives.stragglar.cost import rhd_time, ring_time, stragglar_time
from collectives.stragglar.generator import lower_bound
from collectives.wait_avoiding.group_allreduce import choose_group_allreduce

__all__ = ["COLLECTIVES", "AllreduceCost", "Collective", "GlobalAllreduce", "Network"]

#: Schedules of a blocking allreduce over all P ranks.
Collective = Literal["auto", "ring", "rhd", "recursive_doubling", "stragglar"]
#: The values of :data:`Collective`, in its order.
COLLECTIVES: tuple[Collective, ...] = get_args(Collective)

#: :meth:`GlobalAllreduce.as_tuple`, the form the kernels take:
#: ``(after_last, straggler_aware, reduce_scatter, after_straggler)``.
AllreduceCost: TypeAlias = tuple[float, bool, float, float]


@dataclass(frozen=True)
class GlobalAllreduce:
    """The cost of a blocking allreduce over all ranks, as the kernels take it.

    ``after_last``: seconds from the last rank's arrival to the end.
    ``straggler_aware``: StragglAR: the n - 1 first ranks run a ring
    ReduceScatter (``reduce_scatter`` seconds) as soon as the last of them
    arrives, and the ``after_straggler`` seconds of the schedule's rounds
    start when both that is done and the straggler is there.  As the
    scenario's ``collective`` the straggler is whichever rank arrives last at
    that step (an oracle: the runtime needs it named in advance, so for
    imbalance that moves between ranks this is StragglAR's best case); with
    ``sync="stragglar"`` it is the rank the runtime's predictor names, and a
    wrong name hides nothing (``wagma.sim.kernels._global_end``).
    """

    after_last: float
    straggler_aware: bool = False
    reduce_scatter: float = 0.0
    after_straggler: float = 0.0

    def as_tuple(self) -> AllreduceCost:
        return (self.after_last, self.straggler_aware, self.reduce_scatter, self.after_straggler)


@dataclass(frozen=True)
class Network:
    """alpha (seconds per message) and beta (seconds per byte); ``activation``
    (seconds), the time an activation takes to reach the next level of the
    wait-avoiding collective's binomial tree: the control message (alpha)
    plus the time the receiver's progress thread takes to notice it, which
    on a node where it polls with back-off can exceed alpha by far.  None:
    alpha (a thread that is always polling).

    ``synchronization`` (seconds): what a collective over all P ranks costs
    beyond its alpha-beta messages, from the last rank's arrival to the end
    of the step: the collective's arithmetic and threads, the optimizer
    update and the step's Python.  All P ranks do that work at the same
    time, so where they outnumber the cores they share them, and the cost
    grows with P (measured on 2 cores: 13 ms at 4 ranks, 155 ms at 32,
    where the messages take 0.5 and 7; ``experiments.validate_sim``).  The
    simulator adds it to the end of Allreduce-SGD's steps, of the every-tau
    average of local SGD and WAGMA-SGD, of hierarchical SGD's levels of all
    ranks and of eager-SGD's versions (a rank later than a version's end
    does not pay it: it arrives alone).  It adds it to nothing else: a
    group's, a pair's or a neighbour's exchange involves fewer ranks at
    once, and the measured runs need no term there; EnsembleSync, not
    validated against measured runs, gets none.  0: a core per rank, the
    work negligible against the step.
    """

    alpha: float
    beta: float
    activation: float | None = None
    synchronization: float = 0.0
    #: The encoded bytes per float32 byte of the averages (``compression``:
    #: int8 0.254, bf16 and fp16 0.5); 1: float32, the schedules' own.
    wire_ratio: float = 1.0

    def __post_init__(self):
        for name, value in (
            ("alpha", self.alpha),
            ("beta", self.beta),
            ("activation", self.hop),
            ("synchronization", self.synchronization),
            ("wire_ratio", self.wire_ratio),
        ):
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")

    @property
    def hop(self) -> float:
        """Seconds per level of an activation tree."""
        return self.alpha if self.activation is None else self.activation

    def synchronized(self, cost: "GlobalAllreduce", ranks: int) -> "GlobalAllreduce":
        """``cost``, a collective over all ``ranks``, with :attr:`synchronization`
        added to its end (nothing on one rank: no collective runs)."""
        if ranks <= 1:
            return cost
        if cost.straggler_aware:
            return replace(cost, after_straggler=cost.after_straggler + self.synchronization)
        return replace(cost, after_last=cost.after_last + self.synchronization)

    def message(self, nbytes: float) -> float:
        """One point-to-point message."""
        return self.alpha + nbytes * self.beta

    def allreduce(self, n: int, nbytes: float, collective: Collective = "auto") -> GlobalAllreduce:
        """A blocking allreduce of ``nbytes`` over ``n`` ranks with schedule ``collective``
        (one of :data:`COLLECTIVES`; ``auto`` is the runtime's choice); with a
        :attr:`wire_ratio` below 1 the compressed allreduce
        (:meth:`compressed_allreduce`), or StragglAR's compressed rounds."""
        if collective not in COLLECTIVES:
            raise ValueError(f"collective must be one of {', '.join(COLLECTIVES)}, got {collective!r}")
        if n <= 1:
            return GlobalAllreduce(0.0)
        if self.wire_ratio != 1.0:
            wire = nbytes * self.wire_ratio
            if collective != "stragglar":
                return self.compressed_allreduce(n, wire)
            # The peers' compressed ReduceScatter (pairwise, n - 2 messages of a chunk), then the rounds.
            reduce_scatter = (n - 2) * self.message(wire / (n - 1)) if n > 2 else 0.0
            rounds = stragglar_time(n, wire, self.alpha, self.beta, lower_bound(n))
            return GlobalAllreduce(0.0, True, reduce_scatter, rounds)
        schedule: str = choose_allreduce(int(nbytes), n) if collective == "auto" else collective
        if schedule == "mpi":
            # The library's MPI_Allreduce, which auto takes where no table was
            # measured (every simulated scale): modelled as the classic
            # selection its authors tune, the cheaper of recursive doubling and
            # the bandwidth-optimal schedule for this rank count.
            return min(
                (self.allreduce(n, nbytes, other) for other in ("recursive_doubling", _bandwidth_optimal(n))),
                key=lambda cost: cost.after_last,
            )
        if schedule == "ring":
            return GlobalAllreduce(ring_time(n, nbytes, self.alpha, self.beta))
        if schedule == "rhd":
            return GlobalAllreduce(rhd_time(n, nbytes, self.alpha, self.beta))
        if schedule == "recursive_doubling":
            return GlobalAllreduce(math.ceil(math.log2(n)) * self.message(nbytes))
        rounds = lower_bound(n)  # what the generator reaches (docs/stragglar.md)
        reduce_scatter = ring_time(n - 1, nbytes, self.alpha, self.beta) / 2 if n > 2 else 0.0
        return GlobalAllreduce(0.0, True, reduce_scatter, stragglar_time(n, nbytes, self.alpha, self.beta, rounds))

    def compressed_allreduce(self, n: int, wire: float) -> GlobalAllreduce:
        """The compressed allreduce of ``wire`` encoded bytes over ``n`` ranks
        (:mod:`collectives.compression`): an all-to-all of the encoded chunks,
        then an allgather of the reduced ones, each modelled as the pairwise
        exchange that libraries run for them at scale: n - 1 messages of
        ``wire / n``, one after another, twice.  Bandwidth-optimal in bytes,
        linear in alpha: at 1024 ranks its latency, 2046 alpha, outweighs
        small buffers' bytes."""
        return GlobalAllreduce(2 * (n - 1) * self.message(wire / n))

    def butterfly_phases(self, core_size: int, nbytes: float) -> tuple[np.ndarray, np.ndarray]:
        """The group allreduce of WAGMA among the ``core_size`` core ranks of a
        butterfly group (a power of two: S where P and S are powers of two;
        a folded rank's hand-over to its host and back costs apart, a whole
        message each way): ``(phase, seconds)`` arrays, ``phase`` k meaning
        the k-th of iteration t's partner masks.  Recursive doubling (log2
        ``core_size`` phases of the whole buffer) below the runtime's size
        threshold, else halving/doubling (a ReduceScatter over the masks in
        order, halving the message each phase, then an Allgather over them
        in reverse).  Where a run takes the library's ``MPI_Allreduce`` on
        the group's communicator (``algorithm="mpi"``), the library runs
        these same algorithms (MPICH's and Open MPI's recursive doubling and
        Rabenseifner's), so the same phases model it.  Compressed
        (:attr:`wire_ratio` below 1): :meth:`compressed_allreduce` over the
        core, spread evenly over the phases."""
        levels = core_size.bit_length() - 1
        if self.wire_ratio != 1.0:
            # The compressed allreduce on the group's communicator, its time spread over the
            # phases (a group-wide collective: every member ends when the last has sent).
            total = self.compressed_allreduce(core_size, nbytes * self.wire_ratio).after_last
            return np.arange(levels, dtype=np.int64), np.full(levels, total / max(levels, 1))
        if choose_group_allreduce(int(nbytes)) == "recursive_doubling":
            phases = list(range(levels))
            costs = [self.message(nbytes)] * levels
        else:
            halves = [self.message(nbytes / 2 ** (k + 1)) for k in range(levels)]
            phases = list(range(levels)) + list(reversed(range(levels)))
            costs = halves + halves[::-1]
        return np.array(phases, dtype=np.int64), np.array(costs, dtype=np.float64)


def _bandwidth_optimal(n: int) -> Collective:
    """RHD for a power of two, else the ring (as the runtime's thresholds)."""
    return "rhd" if n & (n - 1) == 0 else "ring"
