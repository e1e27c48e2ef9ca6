"""P replicas in one process, updated by each algorithm's rule as a schedule orders the contributions."""

from collections.abc import Callable, Sequence
from typing import Literal, get_args

import numpy as np
import torch

from collectives.gossip import apply_half_difference, fold_pending
from collectives.wait_avoiding.groups import ButterflyGrouping

from ..algorithms.dpsgd import RING_OFFSETS, RING_WEIGHT
from ..algorithms.sgp import out_peer_offsets
from ..algorithms.wagma_sgd import averages_globally, stale_average
from ..flat import FlatParameters
from .schedule import Schedule

__all__ = ["EMULATED", "Emulated", "Emulator"]

#: The algorithms the emulator runs, Figure 5's (section 5.2 of the WAGMA
#: paper) and eager-SGD.
Emulated = Literal["allreduce_sgd", "local_sgd", "wagma", "dpsgd", "sgp", "eager_sgd", "adpsgd"]
#: The values of :data:`Emulated`, in its order.
EMULATED: tuple[Emulated, ...] = get_args(Emulated)


def _sum(tensors):
    """The sum of ``tensors`` in the order given, in a new tensor."""
    total = tensors[0].clone()
    for tensor in tensors[1:]:
        total.add_(tensor)
    return total


def _butterfly_mean(values: dict, masks, folds=()):
    """The mean of ``values`` (rank -> tensor, a group) added as the
    butterfly schedules add (:mod:`collectives.wait_avoiding.group_allreduce`):
    each ``(host, folded)`` pair of ``folds`` first adds the folded rank's
    tensor to its host's (P not a power of two); then in phase k each
    remaining member (a group closed under every ``rank ^ mask``) adds its
    partner's (rank ^ masks[k]) partial sum, so every member and every
    element gets the same tree of additions; then times 1 / count, count
    the folded ranks included, as ``op="avg"`` scales.

    Addition commutes bitwise, so after phase k the members of each block
    of 2^(k+1) hold the same sum: one member per block is computed (the one
    without the phase's bit; the masks are single bits), count - 1
    additions in all."""
    return _butterfly_sum(values, masks, folds).mul_(1.0 / len(values))


def _butterfly_sum(values: dict, masks, folds=()):
    """The sum :func:`_butterfly_mean` scales (one of ``values`` itself if it
    holds only one)."""
    values = dict(values)
    for host, folded in folds:
        values[host] = values[host] + values.pop(folded)
    for mask in masks:
        values = {r: v + values[r ^ mask] for r, v in values.items() if not r & mask}
    return next(iter(values.values()))


def _folds(grouping: ButterflyGrouping, t: int, group: Sequence[int]) -> list[tuple[int, int]]:
    """The ``(host, folded rank)`` pairs of ``group`` at iteration ``t``."""
    plans = {r: grouping.plan(t, r) for r in group}
    return [(p.folded_into, r) for r, p in plans.items() if p.folded_into is not None]


def _allreduce_mean(values: dict):
    """The mean of every rank's tensor (rank -> tensor, ranks 0..P-1) added
    as recursive doubling adds it over all ranks
    (:func:`~collectives.schedules.halving_doubling.recursive_doubling_allreduce`,
    the runtime's allreduce of small buffers, and MPICH's): with rem = P -
    2**floor(log2 P), rank 2i + 1 first adds rank 2i's tensor for i < rem
    (the fold), then the 2**floor(log2 P) survivors, numbered as virtual
    ranks, add over the masks 1, 2, 4, ...; then times 1 / P."""
    ranks = len(values)
    core = 1 << (ranks.bit_length() - 1)
    rem = ranks - core
    survivors = {v: values[v + rem] for v in range(rem, core)}
    survivors.update({v: values[2 * v + 1] + values[2 * v] for v in range(rem)})
    return _butterfly_sum(survivors, tuple(1 << k for k in range(core.bit_length() - 1))).mul_(1.0 / ranks)


class Emulator:
    """The arithmetic of P ranks of one algorithm, in one process.

    Replica r is ``models[r]`` with ``optimizers[r]``; its trainable
    parameters become views into flat buffers
    (:class:`~wagma.flat.FlatParameters`), as in the MPI runs, and every average is over those
    buffers, one per dtype.  Buffers (BatchNorm statistics) stay each
    replica's own, as the model-averaging algorithms keep them; Allreduce-SGD
    gives every replica rank 0's after each step, as its broadcast does.

    The update rules are the algorithms' own (:mod:`wagma.algorithms`):
    WAGMA-SGD's sync steps and stale average, D-PSGD's ring weights, SGP's
    exponential graph, AD-PSGD's half differences, the collectives'
    averages (the sum, then times 1 / count) and butterfly groups.  What
    depends on the times comes from the schedule:

    * WAGMA-SGD: version t of each group averages, for each member, the
      contribution of the iteration the schedule names (``source``): W'_t
      where fresh, else the last one it published (W'_s of an earlier
      group version, the average of a sync step, or the initial model); a
      fresh member takes the mean, a stale one the stale average.
    * eager-SGD: version v averages over P the gradients the schedule says
      it took (``taken``; a late rank adds zeros, or its late gradients as
      the ``late`` reading says), and every replica applies that average.
    * AD-PSGD: each replica's own order of events (``exchanges``): its
      steps (the gradient at its model, the optimizer step, then the half
      differences pending added, as
      :meth:`~collectives.gossip.PairwiseGossip.fold` does), and between them, after the number of
      steps the table gives, each exchange's copy of the model (the
      parameters plus the differences pending) and its half difference,
      added to the pending ones.  The replicas advance together, the one
      with the fewest steps first, each waiting only where it needs its
      partner's copy.
    * Allreduce-SGD, local SGD, D-PSGD, SGP: synchronous; no schedule.

    Averages add as the butterfly schedules do (recursive doubling over the
    group's masks, the ranks above the largest power of two folded in first;
    over all ranks the masks 1, 2, 4, ... after recursive doubling's fold,
    as ``_allreduce_mean`` adds), so the same
    schedule, models and gradients give the same replicas bitwise, and the
    wait-avoiding collectives' sums bitwise too; an MPI library's
    ``MPI_Allreduce`` may add in another order, where a replay of a logged
    run matches it within rounding.

    Args:
        schedule: a :class:`~wagma.emulate.schedule.Schedule` of one of :data:`EMULATED`.
        models: P ``torch.nn.Module`` replicas (the caller makes them equal
            to start from one model, as ``init_sync`` does).
        optimizers: P optimizers, ``optimizers[r]`` owning ``models[r]``'s
            trainable parameters.

    Attributes:
        flats: each replica's :class:`~wagma.flat.FlatParameters`.
        stale_steps: ``[P]`` steps whose contribution was stale, as
            :attr:`wagma.algorithms.base.Algorithm.stale_steps` counts them.
    """

    def __init__(
        self,
        schedule: Schedule,
        models: Sequence[torch.nn.Module],
        optimizers: Sequence[torch.optim.Optimizer],
    ) -> None:
        if schedule.algorithm not in EMULATED:
            raise ValueError(f"the emulator runs {', '.join(EMULATED)}; got {schedule.algorithm!r}")
        if len(models) != schedule.ranks or len(optimizers) != schedule.ranks:
            raise ValueError(
                f"the schedule is of {schedule.ranks} ranks: give as many models and optimizers, "
                f"got {len(models)} and {len(optimizers)}"
            )
        self.schedule, self.models, self.optimizers = schedule, list(models), list(optimizers)
        self.options = schedule.options
        self.flats = [FlatParameters(model) for model in self.models]
        self.stale_steps = np.zeros(schedule.ranks, dtype=np.int64)
        self._published = None  # WAGMA-SGD: {rank: {iteration: {dtype: tensor}}}
        self._unread = None  # eager-SGD: {(rank, step): {dtype: gradient}}
        self._weights = None  # SGP: the push-sum weights

    @property
    def ranks(self) -> int:
        return self.schedule.ranks

    def run(
        self,
        gradient: Callable[[int, int], object],
        *,
        lr: Callable[[int], float] | None = None,
        after_step: Callable[[int], object] | None = None,
    ) -> np.ndarray:
        """Emulate every step of the schedule.

        Args:
            gradient: ``gradient(r, t)`` computes replica r's gradients of
                step t (forward and backward of rank r's batch of step t on
                ``models[r]``; the emulator has zeroed them) and returns its
                loss (a float, or anything to record).
            lr: ``lr(t)``, the learning rate of step t, set on every
                parameter group before the step's gradient (as
                ``experiments.schedule.LearningRate`` does); None
                leaves the optimizers' own.
            after_step: ``after_step(t)`` once every rank has ended step t
                (evaluations).  Under AD-PSGD faster replicas may be further
                on by then (their steps are ordered by the simulated times).

        Returns:
            ``loss[P, T]``: what ``gradient`` returned.
        """
        loss = np.full((self.ranks, self.schedule.steps), np.nan)
        if self.schedule.algorithm == "adpsgd":
            self._run_adpsgd(gradient, lr, after_step, loss)
            return loss
        step = getattr(self, f"_step_{self.schedule.algorithm}")
        for t in range(self.schedule.steps):
            for r in range(self.ranks):
                loss[r, t] = self._gradient(gradient, lr, r, t)
            step(t)
            if after_step is not None:
                after_step(t)
        return loss

    def _gradient(self, gradient, lr, r, t):
        if lr is not None:
            rate = lr(t)
            for group in self.optimizers[r].param_groups:
                group["lr"] = rate
        self.flats[r].zero_grad()
        return gradient(r, t)

    def _optimizer_steps(self):
        for optimizer in self.optimizers:
            optimizer.step()

    def _average_params(self):
        """Every replica's parameters become their mean."""
        for dtype in self.flats[0].params:
            mean = _allreduce_mean({r: f.params[dtype] for r, f in enumerate(self.flats)})
            for f in self.flats:
                f.params[dtype].copy_(mean)

    # -- the synchronous algorithms ------------------------------------------------

    def _step_allreduce_sgd(self, t):
        """The gradients' mean over all ranks, then every optimizer step; rank 0's buffers to all."""
        for dtype in self.flats[0].grads:
            mean = _allreduce_mean({r: f.grads[dtype] for r, f in enumerate(self.flats)})
            for f in self.flats:
                f.grads[dtype].copy_(mean)
        self._optimizer_steps()
        with torch.no_grad():
            for name, buffer in self.flats[0].buffers.items():
                for f in self.flats[1:]:
                    f.buffers[name].copy_(buffer)

    def _step_local_sgd(self, t):
        self._optimizer_steps()
        if (t + 1) % self.options["period"] == 0:
            self._average_params()

    def _step_dpsgd(self, t):
        """Mix with both ring neighbours' models, then step (combine, then adapt)."""
        if self.ranks > 1:
            for dtype in self.flats[0].params:
                sent = [f.params[dtype].clone() for f in self.flats]
                for r, f in enumerate(self.flats):
                    for o in RING_OFFSETS:
                        f.params[dtype].add_(sent[(r + o) % self.ranks])
                    f.params[dtype].mul_(RING_WEIGHT)
        self._optimizer_steps()

    def _step_sgp(self, t):
        """Push-sum on step t's exponential graph, after the optimizer step on z."""
        self._optimizer_steps()
        if self.ranks == 1:
            return
        if self._weights is None:
            self._weights = [torch.ones(1, dtype=torch.float64) for _ in range(self.ranks)]
        peers = self.options["peers"]
        receive_from = tuple(-o for o in out_peer_offsets(t, peers, self.ranks))
        share = 1.0 / (peers + 1)
        for dtype in self.flats[0].params:
            for f, w in zip(self.flats, self._weights):
                f.params[dtype].mul_(w.item() * share)
            sent = [f.params[dtype].clone() for f in self.flats]
            for r, f in enumerate(self.flats):
                for o in receive_from:
                    f.params[dtype].add_(sent[(r + o) % self.ranks])
        for w in self._weights:
            w.mul_(share)
        sent = [w.clone() for w in self._weights]
        for r, w in enumerate(self._weights):
            for o in receive_from:
                w.add_(sent[(r + o) % self.ranks])
        for f, w in zip(self.flats, self._weights):
            for tensor in f.params.values():
                tensor.div_(w.item())

    # -- WAGMA-SGD -----------------------------------------------------------------

    def _step_wagma(self, t):
        o = self.options
        self._optimizer_steps()
        if averages_globally(t, o["tau"]):
            self._average_params()
            if o["wait_avoiding"]:
                self._publish_all(t)
            return
        if not (o["wait_avoiding"] or o["group_averaging"]):
            return
        if self._published is None:  # the runtime opens its collective at the first step, lending W'_t
            self._published = {r: {t - 1: self._copy_params(r)} for r in range(self.ranks)}
        grouping = ButterflyGrouping(self.ranks, o["group_size"])
        iteration = 0 if o["fixed_groups"] else t
        source = self.schedule.arrays["source"][:, t] if o["wait_avoiding"] else np.full(self.ranks, t)
        for group in grouping.groups(iteration):
            folds = _folds(grouping, iteration, group)
            for dtype in self.flats[0].params:
                mean = _butterfly_mean(
                    {
                        m: self.flats[m].params[dtype] if source[m] == t else self._published[m][source[m]][dtype]
                        for m in group
                    },
                    grouping.masks(iteration),
                    folds,
                )
                for m in group:
                    own = self.flats[m].params[dtype]
                    if o["wait_avoiding"]:  # W'_t is published before the replica moves on
                        self._published[m].setdefault(t, {})[dtype] = own.clone()
                    own.copy_(mean if source[m] == t else stale_average(mean.clone(), own, len(group)))
        self.stale_steps += source < t
        self._forget_published(t)

    def _copy_params(self, r):
        return {dtype: tensor.clone() for dtype, tensor in self.flats[r].params.items()}

    def _publish_all(self, t):
        """A sync step publishes its average as every rank's contribution of iteration t."""
        if self._published is None:
            self._published = {r: {} for r in range(self.ranks)}
        for r in range(self.ranks):
            self._published[r][t] = self._copy_params(r)
        self._forget_published(t)

    def _forget_published(self, t):
        """Drop the contributions no later version reads."""
        later = self.schedule.arrays["source"][:, t + 1 :]
        for r, kept in self._published.items():
            oldest = later[r].min() if later.shape[1] else t + 1
            for s in [s for s in kept if s < oldest]:
                del kept[s]

    # -- eager-SGD -----------------------------------------------------------------

    def _step_eager_sgd(self, t):
        """Version t: the mean over P of the gradients it took; every replica applies it."""
        taken = self.schedule.arrays["taken"]
        if self._unread is None:
            self._unread = {}
        for r, f in enumerate(self.flats):
            if taken[r, t] > t:  # read by a later version (the "newest" and "accumulate" readings)
                self._unread[r, t] = {dtype: g.clone() for dtype, g in f.grads.items()}
        self.stale_steps += taken[:, t] != t
        rows, steps = np.nonzero(taken[:, : t + 1] == t)
        # Oldest first: the runtime adds what is unread into each newer gradient as it is published.
        read = {r: sorted(steps[rows == r]) for r in range(self.ranks)}
        # The partial collectives are group allreduces with S = P; the
        # limiter's synchronous versions the blocking allreduce.
        limiter = self.options["limiter"]
        synchronous = bool(limiter) and (t + 1) % (limiter + 1) == 0
        everyone = ButterflyGrouping(self.ranks, self.ranks)
        folds = _folds(everyone, t, range(self.ranks))
        for dtype, like in self.flats[0].grads.items():
            contributions = []
            for r, f in enumerate(self.flats):
                parts = [f.grads[dtype] if s == t else self._unread[r, s][dtype] for s in read[r]]
                contributions.append(_sum(parts) if parts else torch.zeros_like(like))
            if synchronous:
                mean = _allreduce_mean(dict(enumerate(contributions)))
            else:
                mean = _butterfly_mean(dict(enumerate(contributions)), everyone.masks(t), folds)
            for f in self.flats:
                f.grads[dtype].copy_(mean)
        for key in [k for k in self._unread if taken[k] <= t]:
            del self._unread[key]
        self._optimizer_steps()

    # -- AD-PSGD -------------------------------------------------------------------

    def _run_adpsgd(self, gradient, lr, after_step, loss):
        """Every replica's program of steps and exchanges (:func:`_adpsgd_programs`),
        run as :class:`~collectives.gossip.PairwiseGossip` and
        :class:`~wagma.algorithms.ADPSGD` run them."""
        programs = _adpsgd_programs(self.schedule.arrays["exchanges"], self.ranks, self.schedule.steps)
        pending = [{d: torch.zeros_like(p) for d, p in f.params.items()} for f in self.flats]
        unfolded = [False] * self.ranks
        sent = {}  # (exchange, active) -> the model that side sent
        at, done, reported = [0] * self.ranks, [0] * self.ranks, 0

        def fold(r):  # PairwiseGossip.fold: after an update and at close()
            if unfolded[r]:
                fold_pending(list(self.flats[r].params.values()), [pending[r][d] for d in self.flats[r].params])
                unfolded[r] = False

        while any(at[r] < len(programs[r]) for r in range(self.ranks)):
            ready = [
                r for r in range(self.ranks) if at[r] < len(programs[r]) and _adpsgd_ready(programs[r][at[r]], sent)
            ]
            if not ready:
                raise ValueError(
                    "AD-PSGD's exchanges cannot be ordered: a replica waits for a copy its "
                    "partner never makes (an exchange table not of one run)"
                )
            r = min(ready, key=lambda q: (done[q], q))
            kind, x, active = programs[r][at[r]]
            at[r] += 1
            if kind == "step":
                loss[r, x] = self._gradient(gradient, lr, r, x)
                self.optimizers[r].step()
                fold(r)
                done[r] += 1
                while after_step is not None and reported < min(done):
                    after_step(reported)
                    reported += 1
            elif kind == "copy":
                sent[x, active] = {d: p + pending[r][d] for d, p in self.flats[r].params.items()}
                if not active:
                    received = sent[x, True]
                    for d in pending[r]:
                        apply_half_difference(pending[r][d], sent[x, False][d], received[d].clone())
                    unfolded[r] = True
            else:  # the active side's half difference
                mine, theirs = sent.pop((x, True)), sent.pop((x, False))
                for d in pending[r]:
                    apply_half_difference(pending[r][d], mine[d], theirs[d])
                unfolded[r] = True
        for r in range(self.ranks):  # close(): the differences still pending
            fold(r)


def _adpsgd_programs(exchanges, ranks, steps):
    """Each replica's events in its order: ``("step", t, None)``, and for
    exchange x ``("copy", x, active)`` (the passive side adds its half
    difference at once) and ``("apply", x, True)`` on the active side; the
    events logged after ``c`` updates come after step c - 1, in the rank's
    order.  Exchange x is the k-th of its active and passive ranks'
    pair on both sides (one thread per rank, MPI's order between two ranks)."""
    events = [[] for _ in range(ranks)]
    counts, seen = {}, {}
    for order, (rank, peer, active, copied, applied) in enumerate(np.asarray(exchanges).tolist()):
        pair = (rank, peer) if active else (peer, rank)
        k = seen[pair, active] = seen.get((pair, active), -1) + 1
        x = counts.setdefault((pair, k), len(counts))
        events[rank].append((copied, order, 0, ("copy", x, bool(active))))
        if active:
            events[rank].append((applied, order, 1, ("apply", x, True)))
    programs = []
    for rank in range(ranks):
        mine = sorted(events[rank], key=lambda e: e[:3])
        program, i = [], 0
        for t in range(steps + 1):
            while i < len(mine) and mine[i][0] <= t:
                program.append(mine[i][3])
                i += 1
            if t < steps:
                program.append(("step", t, None))
        if i < len(mine):
            raise ValueError(f"rank {rank}: an exchange logged after update {mine[i][0]} of {steps}")
        programs.append(program)
    return programs


def _adpsgd_ready(event, sent):
    kind, x, active = event
    if kind == "copy" and not active:
        return (x, True) in sent
    if kind == "apply":
        return (x, False) in sent
    return True
