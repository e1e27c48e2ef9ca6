"""EnsembleSync (Xie and Yasunaga): T local steps, then the average of the models that arrived within a timeout."""

import json
from typing import Any

import numpy as np
import torch
from mpi4py import MPI

from collectives.comm import Communicator
from collectives.failures import track
from collectives.member_allreduce import binomial_children, member_allreduce

from ..ensemble_coordinator import TAG_DECISION, TAG_REPORT, Coordinator, Decision, fault_events
from ..options.algorithms import EnsembleSyncOptions
from .base import Algorithm

__all__ = ["EnsembleSync"]

_TAG_AVERAGE = 1000  # + round % _TAG_ROUNDS: one tag per round on the averaging channel
_TAG_ROUNDS = 30000


class EnsembleSync(Algorithm):
    """Local SGD whose synchronizations do not wait for late or dead ranks (EnsembleSync, section 3).

    Every rank takes ``period`` (the paper's T) local optimizer steps; at
    the end of round r (global step ``min((r + 1) T, total)``) it reports to
    the coordinator and the ranks that reported within ``timeout_s`` of the
    round's first report replace their parameters by their average weighted
    by the samples each processed in the round: W = sum_j n_j W_j / sum_j n_j
    (the paper's step 4 averages with equal weights, which is the same when
    every rank processes the same number of samples; the weights matter
    under reallocation, where shares differ).  Buffers (BatchNorm
    statistics) stay local, as in local SGD, and between ``backward()``
    and :meth:`~wagma.algorithms.base.Algorithm.step` the gradients are this rank's own.

    The parameter server, in MPI: the paper's server holds the model, locks
    the workers and times them out.  Here rank 0 runs the server's
    bookkeeping in a thread (:class:`~wagma.ensemble_coordinator.Coordinator`:
    reports, the timeout, the decision of who averages, the reallocation)
    and the averaging itself is a binomial-tree allreduce among the round's
    members (:func:`~collectives.member_allreduce.member_allreduce`): the
    result is the same model the server would send back, in 2 ceil(log2 m)
    message steps (a rank sends and receives at most ceil(log2 m) models)
    instead of rank 0 receiving and sending m of them, and no collective
    ever involves a rank that is late or dead.  Rank 0 keeps
    the server's role for the whole run, so rank 0 must not be stopped or
    killed (the paper's server is not fault tolerant either: "parameter
    server failures ... not implemented"); the fault options refuse it.

    Late ranks (rejoin with fast-forward, section 3.3): a rank that reports
    a round after it closed (it was stopped, or slow beyond the timeout)
    joins the next round to close with weight 0, adopts its average and
    jumps to its end step: :attr:`skipped` is the range of global steps it
    skipped (the training loop records them as such and moves its data
    position past their samples), like the paper's recovered worker that
    "gets the current epoch ... and skips forward".  A rank is not waited
    for again once it has missed a round, until it reports again, so a rank
    that never returns costs one timeout.  The last round waits for every
    rank that is not dead (ULFM), so every living rank ends with the final
    average; so does, where the caller replaces the dead
    (:meth:`expect_replacements`), a round after a death: every living
    rank ends it at the same step, where replacements join.

    Reallocation (``reallocate``, Lemma 1): after each round the
    coordinator sets each rank's samples per step for the next round from
    its speed in the last one (:mod:`wagma.reallocation`); the global batch
    stays ``ranks * batch_size``, and absent ranks' shares go to the others.

    Attributes:
        samples_per_step: this rank's share of the next steps' global batch.
        skipped: after a step that fast-forwarded, ``(first, stop)`` of the
            global steps skipped; else None.
        ensemble: on rank 0, ``(step, parameters)`` of the last average it
            took part in (a copy of each model parameter), for evaluation;
            None before the first.

    Its options object is :class:`~wagma.options.algorithms.EnsembleSyncOptions`.

    Options:
        period: T >= 1, local steps between synchronizations.
        timeout_s: seconds a round waits after its first report, > 0 (the
            paper: 30 s).
        reallocate: Lemma 1's reallocation of the samples per step.
    """

    name = "ensemble_sync"
    Options = EnsembleSyncOptions
    config: EnsembleSyncOptions
    evaluates_ensemble = True

    def __init__(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, comm: Communicator, **options: Any
    ) -> None:
        super().__init__(model, optimizer, comm, **options)
        c = self.config
        self.period, self.timeout_s, self.reallocate = c.period, float(c.timeout_s), c.reallocate
        self._reports, self._decisions = track(comm.control.Dup()), track(comm.control.Dup())
        self._averages = track(comm.data.Dup())
        # Until plan() gives the batch, a step counts as one sample (equal
        # rounds weigh the same) and the run has no known last round.
        self.samples_per_step = 1
        self.coordinator = None
        self._deaths: tuple[int, list[dict[str, Any]]] = (0, [])  # rank 0: the dead counted, and their records
        if comm.rank == 0:
            self.coordinator = Coordinator(self._reports, self._decisions, self.timeout_s, None, 1)

    def plan(self, total_steps: int, batch_size: int) -> None:
        """Also hands the batch and the reallocation policy to rank 0's
        coordinator, which decides the shares (its decisions carry them to
        every rank).  Without it, the run has no last round that waits for
        every living rank."""
        super().plan(total_steps, batch_size)
        if self.coordinator is not None:
            self.coordinator.plan(self._policy, batch_size)

    def _step(self):
        self._optimizer_step()
        self.skipped, self.dead_to_replace = None, 0
        end = self.steps + 1
        if end % self.period == 0 or end == self.total_steps:
            self._synchronize(end)

    def _synchronize(self, end):
        """Report round ``(end - 1) // period``, wait for its decision (or a
        later round's, when late) and average with its members."""
        final = end == self.total_steps
        samples, seconds = self._period_done()
        report = np.array([(end - 1) // self.period, end, samples, seconds, final], float)
        self._reports.Send(report, dest=0, tag=TAG_REPORT)
        buffer = np.empty(Decision.width(self.comm.size))
        self._decisions.Recv(buffer, source=0, tag=TAG_DECISION)
        decision = Decision(buffer, self.comm.size)
        self._average(decision)
        self.samples_per_step = int(decision.shares[self.comm.rank])
        self.dead_to_replace = decision.heal
        if decision.end_step > end:
            self.skipped = (end, decision.end_step)
            self.steps = decision.end_step - 1  # step() adds the one of this call
        if self.comm.rank == 0 and decision.weights[0] >= 0:
            self.ensemble = (decision.end_step, [p.detach().clone() for p in self.model.parameters()])

    def _average(self, decision):
        members = decision.weights[decision.weights >= 0]
        # Every member's samples are 0 only in a round that began at a
        # membership change (no step of it was timed): equal weights.
        weight = decision.weights[self.comm.rank] / members.sum() if members.sum() > 0 else 1.0 / len(members)
        tag = _TAG_AVERAGE + decision.round % _TAG_ROUNDS
        position = list(decision.members).index(self.comm.rank)
        sends = len(binomial_children(position, len(decision.members))) + (position > 0)
        for dtype, tensor in self.flat.params.items():
            host = tensor.detach().cpu().numpy()  # a view on the CPU, a staging copy from a GPU
            host *= weight
            compressor = self._compressor(("average", dtype), tensor)
            member_allreduce(host, self._averages, decision.members, tag, compressor)
            if compressor is None:
                self._bytes_counted += sends * host.nbytes
            if tensor.device.type != "cpu":
                tensor.copy_(torch.from_numpy(host))

    def expect_replacements(self, wanted: bool) -> None:
        """Where ``wanted``, a round open while rank 0's coordinator knows of a
        dead rank waits for every living rank, with no timeout, and tells
        them how many are dead (``dead_to_replace``): all stand at its
        end step, where they can replace the dead together."""
        if self.coordinator is not None:
            self.coordinator.heal = wanted

    def sync_tables(self) -> dict[str, tuple[np.ndarray, list[str]]]:
        """On rank 0, the coordinator's round log as table ``rounds``."""
        if self.coordinator is None or not self.coordinator.log:
            return {}
        return {"rounds": (self.coordinator.rows(), self.coordinator.columns())}

    @property
    def dead_ranks(self) -> set[int]:
        """The ranks that left the job (:attr:`~wagma.algorithms.base.Algorithm.membership`) and, on rank 0,
        those its coordinator found dead (ULFM) without a shrink; as ranks
        of the first communicator."""
        found = self.coordinator.dead if self.coordinator is not None else set()
        return super().dead_ranks | {self.membership.original_ranks[r] for r in found}

    def deaths_without_shrink(self) -> list[dict[str, Any]]:
        """On rank 0: the ranks its coordinator found dead, from the round
        log (:func:`~wagma.ensemble_coordinator.fault_events`): the step is
        the end of the first round they missed, the wait is that round's."""
        dead = self.coordinator.dead if self.coordinator is not None else set()
        if len(dead) != self._deaths[0]:  # the round log is read again only when someone else died
            self._deaths = (len(dead), self._read_deaths() if dead else [])
        return self._deaths[1]

    def _read_deaths(self) -> list[dict[str, Any]]:
        assert self.coordinator is not None
        return [
            {
                "rank": self.membership.original_ranks[event["rank"]],
                "step": event["missed_step"],
                "waited_s": event["others_waited_s"],
                "timed_out": event["others_waited_s"] >= self.timeout_s,
            }
            for event in fault_events(self.coordinator.rows(), self.coordinator.ranks)
            if event["kind"] == "dead"
        ]

    def run_attributes(self) -> dict[str, Any]:
        """On rank 0: ``fault_events``, the outages the whole round log shows
        (:func:`~wagma.ensemble_coordinator.fault_events`)."""
        if self.coordinator is None:
            return {}
        return {"fault_events": json.dumps(fault_events(self.coordinator.rows(), self.coordinator.ranks))}

    def abandon(self) -> None:
        """After a failure: the coordinator's thread ends on its revoked
        channel; the channels are let go.  The survivors' rank 0 runs the
        coordinator of the rebuilt algorithm, from the round of the step
        they go on from."""
        if self.coordinator is not None:
            self.coordinator.abandon()
        super().abandon()

    def close(self) -> None:
        """Stop the coordinator (rank 0) and free the channels; local, so
        that a dead rank cannot block it."""
        if self._reports == MPI.COMM_NULL:
            return
        if self.coordinator is not None:
            self.coordinator.stop()
        for channel in (self._reports, self._decisions, self._averages):
            channel.Free()
        super().close()
