"""Local SGD: every rank trains alone and the models are averaged every ``period`` steps."""

from typing import Any

import torch

from collectives import allreduce
from collectives.comm import Communicator

from ..options.algorithms import LocalSGDOptions
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

    Options (:class:`~wagma.options.algorithms.LocalSGDOptions`): ``period``
    (tau), ``reallocate`` (one more allgather of two numbers per average),
    ``sync``.

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
        self.period = self.config.period
        self._open_straggler_sync(self.config.sync, self.flat.params.values())

    def _step(self):
        self._optimizer_step()
        if (self.steps + 1) % self.period == 0:
            if self.straggler_sync is not None:
                self.straggler_sync(list(self.flat.params.values()))
            else:
                for tensor in self.flat.params.values():
                    allreduce(tensor, comm=self.comm, op="avg")
            if self._policy is not None:
                self._reallocate()
