"""Hierarchical SGD (seed 000, PyTorch's HierarchicalModelAverager): model averaging at several levels."""

from typing import Any, cast

import torch

from collectives import Communicator

from ..options.algorithms import HierarchicalSGDOptions
from .base import Algorithm

__all__ = ["HierarchicalSGD"]


class HierarchicalSGD(Algorithm):
    """Local SGD whose averaging happens in nested groups at different periods.

    ``period_group_size_dict`` maps a period to a group size, periods
    increasing, the last group size P (e.g. ``{2: 4, 8: P}``: groups of 4
    consecutive ranks average every 2 steps, all ranks every 8).  Step t
    (counted from 0): during the first ``warmup_steps`` steps the gradients
    are averaged over all ranks before the optimizer step (synchronous SGD,
    as DDP's post-local-SGD hook does); afterwards each rank steps alone, and
    when some periods divide t only the largest of them averages the models,
    within its groups of consecutive ranks.  This is the rule of PyTorch's
    ``HierarchicalModelAverager(period_group_size_dict, warmup_steps)``
    (``step >= warmup_steps`` and ``step % period == 0``; note: ``step``,
    not ``step - warmup_steps``) called after every optimizer step, and is
    tested equal to it.  Buffers (BatchNorm statistics) stay local.

    Between ``backward()`` and :meth:`~wagma.algorithms.base.Algorithm.step` the gradients are this rank's
    own, warm-up steps included (their average is taken inside
    :meth:`~wagma.algorithms.base.Algorithm.step`, before the optimizer step).

    One :class:`~collectives.comm.Communicator` per level below the top,
    made at construction (collective) and freed by :meth:`close`.

    Its options object is :class:`~wagma.options.algorithms.HierarchicalSGDOptions`.

    Options:
        period_group_size_dict: ``{period: group_size}``, see above (a
            size ``"P"`` is all ranks), or ``"auto"``: ``{2: sqrt(P), 10: P}``.
        warmup_steps: steps of gradient averaging before local steps, >= 0.
    """

    name = "hierarchical_sgd"
    Options = HierarchicalSGDOptions
    config: HierarchicalSGDOptions

    def __init__(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, comm: Communicator, **options: Any
    ) -> None:
        super().__init__(model, optimizer, comm, **options)
        self.warmup_steps = self.config.warmup_steps
        self.levels: list[tuple[int, Communicator]] = []
        # Resolved: a dict whose sizes are ints ("P" made the rank count).
        levels = cast("dict[int, int]", self.config.period_group_size_dict)
        for period, size in levels.items():
            if size == comm.size:
                group = comm
            else:
                split = comm.data.Split(comm.rank // size, comm.rank)
                # mpi4py's stub types Split as returning a Comm; an Intracomm's gives an Intracomm.
                group = Communicator(split)  # type: ignore[arg-type]
                split.Free()
            self.levels.append((period, group))

    def averaging_level(self, t: int) -> Communicator | None:
        """The communicator that averages after step t, or None."""
        if t < self.warmup_steps:
            return None
        for period, group in reversed(self.levels):
            if t % period == 0:
                return group
        return None

    def _step(self):
        t = self.steps
        if t < self.warmup_steps:
            self.flat.attach_grads()  # gradients optimizer.zero_grad() set to None
            for i, tensor in enumerate(self.flat.grads.values()):
                self._average_over(tensor, self.comm, ("warm-up", i))
        self._optimizer_step()
        group = self.averaging_level(t)
        if group is not None:
            for i, tensor in enumerate(self.flat.params.values()):
                self._average_over(tensor, group, ("level", group.size, i))

    def abandon(self) -> None:
        """Let go of the level communicators (revoked after a failure)."""
        self.levels = []
        super().abandon()

    def close(self) -> None:
        for _, group in self.levels:
            if group is not self.comm:
                group.close()
        self.levels = []
        super().close()
