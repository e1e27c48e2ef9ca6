"""Local SGD: every rank trains alone and the models are averaged every ``period`` steps."""

from typing import Any

import torch

from collectives.comm import Communicator

from ..options.algorithms import LocalSGDOptions, has_outer_optimizer
from .base import Algorithm

__all__ = ["LocalSGD"]


class LocalSGD(Algorithm):
    """Local SGD with periodic model averaging (period tau; tau = 1 is
    synchronous model averaging).

    Step t (counted from 0) is the optimizer step of every rank on its own;
    after it, when ``(t + 1) % period == 0``, all ranks replace their
    parameters by the average over all ranks (one allreduce per dtype of the
    flat buffer).  This is WAGMA-SGD's sync-step rule (Algorithm 2, line 8),
    so WAGMA with both switches off equals it, and it fires on the same steps
    as PyTorch's ``PeriodicModelAverager(period, warmup_steps=period - 1)``
    called after every optimizer step.  Buffers (BatchNorm statistics) stay
    local.
    Between ``backward()`` and :meth:`~wagma.algorithms.base.Algorithm.step` the gradients are this rank's
    own (model averaging, by design): clipping clips the local gradient.

    With an outer optimizer (``outer_lr`` other than 1 or ``outer_momentum``
    other than 0), the average is DiLoCo's outer step instead
    (:class:`~wagma.outer.OuterOptimizer`): the ranks average their
    pseudo-gradients, the model of the last average minus their own, and
    every rank takes SGD's step (Nesterov's with ``outer_nesterov``) from
    the model of the last average.  With the inner optimizer AdamW that is
    DiLoCo with H = ``period``; with plain SGD it is local SGD whose
    averages take a server-side learning rate and momentum (FedOpt).

    Options (:class:`~wagma.options.algorithms.LocalSGDOptions`): ``period``
    (tau), ``reallocate`` (one more allgather of two numbers per average),
    ``sync``, ``outer_lr``, ``outer_momentum``, ``outer_nesterov``.

    Example::

        algo = wagma.algorithms.create("local_sgd", model, optimizer, comm, period=8)
        for x, y in loader:
            algo.zero_grad()
            loss_fn(model(x), y).backward()
            algo.step()
    """

    name = "local_sgd"
    Options = LocalSGDOptions
    config: LocalSGDOptions

    def __init__(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, comm: Communicator, **options: Any
    ) -> None:
        super().__init__(model, optimizer, comm, **options)
        c = self.config
        self.period = c.period
        self._open_straggler_sync(c.sync, self.flat.params.values())
        if has_outer_optimizer(c):
            self._open_outer(c.outer_lr, c.outer_momentum, c.outer_nesterov)

    def _step(self):
        self._optimizer_step()
        if (self.steps + 1) % self.period == 0:
            if self.outer is not None:
                self._outer_step()
            else:
                self._average_globally(list(self.flat.params.values()))
            if self._policy is not None:
                self._reallocate()
