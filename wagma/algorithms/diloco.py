"""DiLoCo (Douillard et al., 2023): H inner steps, then an outer step on the averaged pseudo-gradient."""

from typing import Any

import torch

from collectives.comm import Communicator

from ..options.algorithms import DiLoCoOptions
from .base import Algorithm

__all__ = ["DiLoCo"]


class DiLoCo(Algorithm):
    """DiLoCo: local training with the user's optimizer, an outer step every H steps.

    Algorithm 1 of Douillard et al. (2023), on the flat parameter buffers:
    step t (counted from 0) is the inner optimizer's step (the user's
    optimizer: AdamW in the paper) on this rank's own data.  After it, when
    ``(t + 1) % period == 0`` (H = ``period``, local SGD's rule), the outer
    step (:class:`~wagma.outer.OuterOptimizer`): every rank's
    pseudo-gradient Delta_i = theta^(t-1) - theta_i, theta^(t-1) the
    model of the last outer step (the starting model at first), is averaged
    over the ranks (the round's one communication, one allreduce per dtype,
    or StragglAR with ``sync="stragglar"``), and every rank's model becomes
    theta^(t) = OuterOpt(theta^(t-1), Delta): SGD with Nesterov momentum
    (``outer_lr`` 0.7, ``outer_momentum`` 0.9, the paper's).

    State, as the paper keeps it: the inner optimizer's state (AdamW's
    moments) is each rank's own, never averaged nor reset at an outer step;
    the outer state (theta^(t-1) and the momentum buffer) is the same on
    every rank, because every rank applies the same average, and is never
    sent.  :meth:`~wagma.algorithms.base.Algorithm.state_dict` carries it,
    so a resumed run goes on with the same outer momentum.  Buffers
    (BatchNorm statistics) stay local, as local SGD's.

    Between ``backward()`` and :meth:`~wagma.algorithms.base.Algorithm.step`
    the gradients are this rank's own (the inner phase is local by design):
    clipping clips the local gradient.

    With ``outer_lr=1, outer_momentum=0`` this is local SGD with period H
    (up to the rounding of theta^(t-1) - Delta); local SGD's and
    WAGMA-SGD's own outer options give their global averages the same step.

    Options (:class:`~wagma.options.algorithms.DiLoCoOptions`): ``period``
    (H, the paper's 500), ``outer_lr``, ``outer_momentum``,
    ``outer_nesterov``, ``sync``.

    Example::

        optimizer = torch.optim.AdamW(model.parameters(), lr=4e-4, weight_decay=0.1)
        algo = wagma.algorithms.create("diloco", model, optimizer, comm, period=500)
        for x, y in loader:
            algo.zero_grad()
            loss_fn(model(x), y).backward()
            algo.step()
    """

    name = "diloco"
    Options = DiLoCoOptions
    config: DiLoCoOptions

    def __init__(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, comm: Communicator, **options: Any
    ) -> None:
        super().__init__(model, optimizer, comm, **options)
        c = self.config
        self.period = c.period
        outer = self._open_outer(c.outer_lr, c.outer_momentum, c.outer_nesterov)
        self._open_straggler_sync(c.sync, outer.deltas)

    def _step(self):
        self._optimizer_step()
        if (self.steps + 1) % self.period == 0:
            self._outer_step()
