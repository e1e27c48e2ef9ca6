"""One step's computation, real or emulated, with the imbalance model's delay injected."""

import math
import time

import torch

from .tasks import loss_and_correct

__all__ = ["StepCompute"]


class StepCompute:
    """Forward and backward of one batch, made as slow as the imbalance model says.

    ``real`` compute sleeps first and then runs forward and backward, so a
    late rank also starts its gradient communication late (as a slow GPU
    would).  The sleep is the rank's delay (``"delay"`` models) plus the
    padding up to ``compute_ms``, or (``"compute"`` models) the padding up
    to the drawn time; padding is what the target time exceeds the rank's
    last measured forward/backward time by (the current one is not known
    before it runs).

    ``emulate`` compute: no forward or backward; the rank sleeps
    ``compute_ms + delay`` (``"delay"`` models) or the drawn time
    (``"compute"`` models) and leaves its gradients at zero, so the
    algorithm still communicates full-size buffers.  The loss is NaN.

    :meth:`__call__` returns ``(loss, injected seconds)``: the delay
    (padding not included) or, for ``"compute"`` models, the sleep (the
    drawn time when emulated).  ``share``: the step's batch over the run's
    ``--batch-size`` (reallocation); ``compute_ms`` scales with it, as the
    compute of a batch does.
    """

    def __init__(self, model, spec, imbalance, mode, compute_ms, rank):
        self.model, self.spec, self.imbalance = model, spec, imbalance
        self.mode, self.base, self.rank = mode, compute_ms / 1e3, rank
        self._last = 0.0

    def __call__(self, step, batch, zero_grad, share=1.0):
        drawn = float(self.imbalance.seconds(step)[self.rank])
        zero_grad()
        delay = self.imbalance.kind == "delay"
        base = self.base * share
        if self.mode == "emulate":
            time.sleep(base + drawn if delay else drawn)
            return math.nan, drawn
        pause = (drawn if delay else 0.0) + max(0.0, (base if delay else drawn) - self._last)
        if pause > 0:
            time.sleep(pause)
        start = time.perf_counter()
        device = next(self.model.parameters()).device
        batch = tuple(t.to(device, non_blocking=True) for t in batch)
        loss, _, _ = loss_and_correct(self.model, batch, self.spec)
        loss.backward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        self._last = time.perf_counter() - start
        return loss.item(), drawn if delay else pause
