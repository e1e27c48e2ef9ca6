"""WAGMA-SGD (Li et al., IEEE TPDS 2021, Algorithm 2): wait-avoiding group model averaging."""

from typing import Any

import torch

from collectives import WaitAvoidingGroupAllreduce, group_allreduce
from collectives.comm import Communicator
from collectives.compression import Compressor
from collectives.wait_avoiding.groups import ButterflyGrouping

from ..options.algorithms import WagmaOptions, has_outer_optimizer
from .base import Algorithm, held_compressors

__all__ = ["WagmaSGD", "averages_globally", "stale_average"]


def averages_globally(t: int, tau: int) -> bool:
    """Whether step t is a sync step, the global average of Algorithm 2's
    line 8: ``(t + 1) mod tau == 0``."""
    return (t + 1) % tau == 0


def stale_average(mean: torch.Tensor, own: torch.Tensor, group_size: int) -> torch.Tensor:
    """A stale rank's W_{t+1} (Algorithm 2, line 13), in place of ``mean``:
    ``(S * mean + W'_t) / (S + 1)``, where ``mean`` is the average of the
    ``group_size`` = S members of its group of version t (made with this
    rank's older contribution) and ``own`` its W'_t.  Returns ``mean``."""
    s = group_size
    return mean.mul_(s / (s + 1)).add_(own, alpha=1.0 / (s + 1))


class WagmaSGD(Algorithm):
    """Model averaging in butterfly groups of S, globally every tau steps.

    Step t (Algorithm 2): the local optimizer step gives W'_t.  If
    ``(t + 1) % tau == 0`` all P ranks average (W_{t+1} = sum / P, a blocking
    allreduce).  Otherwise, with ``wait_avoiding`` (the paper's alpha), the
    wait-avoiding group allreduce of version t: a fresh contribution gives
    W_{t+1} = sum / S_t, a stale one (version t began before this rank got
    there) W_{t+1} = (sum + W'_t) / (S_t + 1), S_t the size of the rank's
    group at step t (S for P and S powers of two; on any other P between S
    and 2S, :class:`~collectives.wait_avoiding.groups.ButterflyGrouping`);
    with ``group_averaging`` (beta)
    the same groups average with a blocking group allreduce (W_{t+1} = sum / S_t,
    D-PSGD/SGP-like); with neither, nothing happens between sync steps and the
    algorithm is local SGD with period tau (tested equal to ``local_sgd``).
    With ``fixed_groups`` the groups of either switch are iteration 0's at
    every step instead of Algorithm 1's dynamic ones (the paper's ablation 2).
    Buffers (BatchNorm statistics) stay local.
    Between ``backward()`` and :meth:`~wagma.algorithms.base.Algorithm.step` the gradients are this rank's
    own (model averaging, by design): clipping clips the local gradient.

    One :class:`~collectives.wait_avoiding.collective.WaitAvoidingGroupAllreduce` per parameter dtype,
    opened at the first step with this step's counter (so a resumed run's
    versions continue) and closed by :meth:`close`.  The flat parameter
    buffer it is given at step t stays the published W'_t, and the
    parameters are rebound to the result buffer
    (:meth:`~wagma.flat.FlatParameters.rebind`), so no step copies the model.

    Its options object is :class:`~wagma.options.algorithms.WagmaOptions`.

    Options:
        group_size: S, an int with 1 <= S <= P (the groups' least size),
            or ``"auto"`` (about sqrt(P), as the paper;
            :func:`~wagma.options.algorithms.auto_group_size`).
        tau: the global synchronisation period, >= 1 (the paper: 10).
        wait_avoiding: alpha, use the wait-avoiding group allreduce.
        group_averaging: beta, use the blocking group allreduce.
        fixed_groups: average in the same groups at every step, iteration
            0's (for powers of two blocks of S consecutive ranks), not Algorithm 1's dynamic
            butterfly groups: section 5.2, experiment 2 ("group model
            averaging without using the dynamic grouping strategy (i.e., the
            groups are fixed)", top-1 accuracy "drops to 72.2%").  Needs
            ``wait_avoiding`` or ``group_averaging`` (with both off no groups
            average).
        reallocate: after each global average, Lemma 1's shares of the
            global batch for the next tau steps (:mod:`wagma.reallocation`).
        sync: ``"allreduce"`` or ``"stragglar"``: the global average every
            tau steps as StragglAR with the rank predicted to arrive last as
            its straggler (:mod:`collectives.stragglar.training_sync`; the same
            average up to the order of the float additions).  Between global
            averages the wait-avoiding groups let a slow rank fall behind
            without holding anyone up, so the tau-step average is where its
            lateness shows, and where StragglAR can hide it.
        outer_lr, outer_momentum, outer_nesterov: an outer optimizer on the
            global average (off at their defaults, 1 and 0).  With it, line
            8 becomes DiLoCo's outer step (:class:`~wagma.outer.OuterOptimizer`):
            the ranks average their pseudo-gradients, W_a - W'_t with W_a the
            model of the last global average, and W_{t+1} is SGD's step
            from W_a (Nesterov's by default).  The tau steps between global
            averages, local steps and group averages together, are then
            DiLoCo's inner phase: the group averages keep the replicas near
            one another, and the outer step extrapolates along their
            averaged progress since W_a.  Nothing else changes, so the
            wait-avoiding groups' staleness and the outer momentum combine.
    """

    name = "wagma"
    Options = WagmaOptions
    config: WagmaOptions

    def __init__(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, comm: Communicator, **options: Any
    ) -> None:
        super().__init__(model, optimizer, comm, **options)
        c = self.config
        self.group_size, self.tau = c.group_size, c.tau
        self.wait_avoiding, self.group_averaging = c.wait_avoiding, c.group_averaging
        self.fixed_groups = c.fixed_groups
        assert isinstance(self.group_size, int)  # resolved: "auto" made the size for P
        self._grouping = ButterflyGrouping(comm.size, self.group_size, not self.fixed_groups)
        self._collectives: dict[torch.dtype, WaitAvoidingGroupAllreduce[torch.Tensor]] | None = None
        self._open_straggler_sync(c.sync, self.flat.params.values())
        if has_outer_optimizer(c):
            self._open_outer(c.outer_lr, c.outer_momentum, c.outer_nesterov)

    def _step(self):
        t = self.steps
        self._optimizer_step()
        if self.wait_avoiding and self._collectives is None:
            self._collectives = {
                dtype: WaitAvoidingGroupAllreduce(
                    self.comm.data,
                    tensor,
                    group_size=self.group_size,
                    tau=self.tau,
                    op="avg",
                    first_iteration=t,
                    dynamic_groups=not self.fixed_groups,
                    compression=self.compression,
                ).open()
                for dtype, tensor in self.flat.params.items()
            }
        if averages_globally(t, self.tau):
            self.contribution = t
            self._global_average(t)
            if self._policy is not None:
                self._reallocate()
            return
        first = next(iter(self.flat.params))
        for dtype, tensor in self.flat.params.items():
            if self.wait_avoiding:
                # W'_t (tensor) is lent to the collective; the model moves to
                # the result buffer instead of the result being copied back.
                result = self._collectives[dtype].allreduce(tensor, t)
                if self.compression == "none":
                    self._count_allreduces(result.group_size, [tensor])
                if dtype == first:
                    self.contribution = result.contribution_iteration
                if not result.fresh:
                    stale_average(result.value, tensor, result.group_size)
                    self.stale_steps += 1
                self.flat.rebind(dtype, params=result.value)
            elif self.group_averaging:
                self.contribution = t
                compressor = self._compressor(("group", dtype), tensor)
                group_allreduce(
                    tensor,
                    comm=self.comm,
                    group_size=self.group_size,
                    t=t,
                    op="avg",
                    dynamic_groups=not self.fixed_groups,
                    compressor=compressor,
                )
                if compressor is None:
                    self._count_allreduces(self._grouping.plan(t, self.comm.rank).size, [tensor])

    def _global_average(self, t):
        """Algorithm 2, line 8: W_{t+1} = the average of every rank's W'_t
        (or, with an outer optimizer, its outer step)."""
        if self.outer is not None:
            self._outer_step()
            for dtype, tensor in self.flat.params.items():
                if self.wait_avoiding:
                    self._collectives[dtype].sync_reduced(tensor, t)
            return
        sync = self.straggler_sync
        if sync is not None:
            sync.begin()
        for dtype, tensor in self.flat.params.items():
            # Without a predicted straggler, exactly the average of
            # sync="allreduce" (the wait-avoiding collective's own).
            if sync is not None and sync.straggler is not None:
                sync.reduce(tensor, self._compressor(("global", dtype), tensor))
                if self.wait_avoiding:
                    self._collectives[dtype].sync_reduced(tensor, t)
            elif self.wait_avoiding:
                self._collectives[dtype].sync_allreduce(tensor, t, op="avg")
            else:
                self._average_over(tensor, self.comm, ("global", dtype))
                continue
            if self.compression == "none":
                self._count_allreduces(self.comm.size, [tensor])
        if sync is not None:
            sync.end()

    def compressors(self) -> list[Compressor]:
        """The algorithm's streams and its wait-avoiding collectives' (groups and sync steps)."""
        return super().compressors() + held_compressors(self._collectives)

    def abandon(self) -> None:
        """Stop the progress threads without communicating (a dead rank)."""
        self._keep_bytes_of(self._collectives)
        for wa in (self._collectives or {}).values():
            wa.abandon()
        self._collectives = None
        super().abandon()

    def close(self) -> None:
        self._keep_bytes_of(self._collectives)
        for wa in (self._collectives or {}).values():
            wa.close()
        self._collectives = None
        super().close()
