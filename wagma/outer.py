"""The outer optimizer of DiLoCo: a step on the averaged pseudo-gradient, from the model of the last outer step."""

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

__all__ = ["OuterOptimizer"]


class OuterOptimizer:
    """DiLoCo's outer step (Douillard et al., 2023, Algorithm 1) over flat tensors.

    It keeps the *anchor* theta^(t-1), the global model of the last outer
    step (at first the model it is built from), and SGD over the anchor:
    Nesterov momentum by default, the paper's outer optimizer.  One outer
    step, :meth:`step`, on every rank with its inner model theta_i:

    1. the pseudo-gradient Delta_i = theta^(t-1) - theta_i (line 10);
    2. ``average([Delta_i])`` replaces it by the ranks' average Delta
       (line 11: the one communication, done by the caller's reduction);
    3. theta^(t) = OuterOpt(theta^(t-1), Delta) (line 12): ``torch.optim.SGD``
       with Delta as the anchor's gradient, so the momentum rule is torch's
       (buf = momentum * buf + Delta; Nesterov: the step is Delta + momentum * buf);
    4. the inner model becomes theta^(t), and theta^(t) is the next anchor.

    State, as the paper keeps it: the anchor and the momentum buffer are
    the same on every rank (every rank applies the same average to the same
    anchor), so neither is communicated; the inner optimizer's state
    (AdamW's moments) is each rank's own, never averaged and never reset.

    Memory: one copy of the model (the anchor), one for the pseudo-gradient
    and, with momentum, one for the buffer.

    Args:
        tensors: the model's tensors the outer step covers (flat buffers, or
            a fragment's), which give the anchor its first value.
        lr: the outer learning rate (DiLoCo: 0.7).  ``lr=1, momentum=0`` is
            plain averaging (theta^(t) = the ranks' average, up to the
            rounding of theta^(t-1) - Delta).
        momentum: the outer momentum (DiLoCo: 0.9).
        nesterov: Nesterov's momentum (DiLoCo), else heavy ball.
    """

    def __init__(self, tensors: Sequence[torch.Tensor], *, lr: float, momentum: float, nesterov: bool) -> None:
        #: theta^(t-1), the global model of the last outer step, one tensor per tensor given.
        self.anchors = [t.detach().clone() for t in tensors]
        #: The pseudo-gradients, then (after the caller's average) Delta.
        self.deltas = [torch.empty_like(a) for a in self.anchors]
        self.lr, self.momentum, self.nesterov = lr, momentum, nesterov and momentum > 0
        self._sgd = torch.optim.SGD(self.anchors, lr=lr, momentum=momentum, nesterov=self.nesterov)

    def pseudo_gradients(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Delta_i = anchor - ``tensors`` into :attr:`deltas` (returned)."""
        for delta, anchor, tensor in zip(self.deltas, self.anchors, tensors):
            torch.sub(anchor, tensor, out=delta)
        return self.deltas

    def apply(self, averaged: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The outer step on the averaged pseudo-gradients: the anchors
        become theta^(t) (returned)."""
        for anchor, delta in zip(self.anchors, averaged):
            anchor.grad = delta
        self._sgd.step()
        for anchor in self.anchors:
            anchor.grad = None
        return self.anchors

    def step(
        self, tensors: Sequence[torch.Tensor], average: Callable[[list[torch.Tensor]], None]
    ) -> list[torch.Tensor]:
        """One outer step of the model ``tensors`` (steps 1 to 4 above):
        ``average`` averages its list of tensors over the ranks in place."""
        average(self.pseudo_gradients(tensors))
        with torch.no_grad():
            for tensor, anchor in zip(tensors, self.apply(self.deltas)):
                tensor.copy_(anchor)
        return self.anchors

    def state_dict(self) -> dict[str, Any]:
        """The anchors and the outer SGD's state (the momentum buffers)."""
        return {"anchors": [a.clone() for a in self.anchors], "sgd": self._sgd.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        anchors = state["anchors"]
        if [(a.shape, a.dtype) for a in anchors] != [(a.shape, a.dtype) for a in self.anchors]:
            raise ValueError(
                f"outer optimizer state for tensors {[(tuple(a.shape), a.dtype) for a in anchors]}, "
                f"not {[(tuple(a.shape), a.dtype) for a in self.anchors]}"
            )
        with torch.no_grad():
            for mine, saved in zip(self.anchors, anchors):
                mine.copy_(saved)
        self._sgd.load_state_dict(state["sgd"])
