"""One step's computation, real or emulated, with the imbalance model's delay injected."""

import math
import time

import torch

from .tasks import loss_and_correct

__all__ = ["StepCompute"]


class StepCompute:
    """Forward and backward of one batch, made as slow as the imbalance model says.

    ``real`` compute: with a ``"delay"`` model the rank first sleeps its
    delay, then runs forward and backward, so a late rank also starts its
    gradient communication late (as a slow GPU would); with a ``"compute"``
    model the step is padded to the drawn time: the rank sleeps
    ``drawn - c`` first, where c is its last measured forward/backward time
    (the current one is not known before it runs).

    ``emulate`` compute: no forward or backward; the rank sleeps
    ``emulate_ms + delay`` (``"delay"`` models) or the drawn time
    (``"compute"`` models) and leaves its gradients at zero, so the
    algorithm still communicates full-size buffers.  The loss is NaN.

    :meth:`__call__` returns ``(loss, injected seconds)``.
    """

    def __init__(self, model, spec, imbalance, mode, emulate_ms, rank):
        self.model, self.spec, self.imbalance = model, spec, imbalance
        self.mode, self.base, self.rank = mode, emulate_ms / 1e3, rank
        self._last = 0.0

    def __call__(self, step, batch, zero_grad):
        drawn = float(self.imbalance.seconds(step)[self.rank])
        zero_grad()
        if self.mode == "emulate":
            seconds = self.base + drawn if self.imbalance.kind == "delay" else drawn
            time.sleep(seconds)
            return math.nan, drawn
        injected = drawn if self.imbalance.kind == "delay" else max(0.0, drawn - self._last)
        if injected > 0:
            time.sleep(injected)
        start = time.perf_counter()
        device = next(self.model.parameters()).device
        batch = tuple(t.to(device, non_blocking=True) for t in batch)
        loss, _, _ = loss_and_correct(self.model, batch, self.spec)
        loss.backward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        self._last = time.perf_counter() - start
        return loss.item(), injected
