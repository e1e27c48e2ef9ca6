"""The learning-rate schedule of the paper's set-up: linear warm-up, then step decay (Goyal et al. 2017)."""

import bisect

__all__ = ["LearningRate"]


class LearningRate:
    """The learning rate at every step, a pure function of the step.

    Steps ``0 .. warmup - 1`` ramp linearly from ``warmup_start * lr`` towards
    ``lr`` (step t uses ``lr * (s + (1 - s) * t / warmup)``); afterwards the
    rate is ``lr * decay_factor ** k`` where k counts the decay epochs
    already reached.  A pure function of the step (no scheduler state), so a
    resumed run continues the same schedule from its step counter.

    Args:
        lr: the peak learning rate.
        steps_per_epoch: steps of one epoch (epochs are converted to steps).
        warmup_epochs: length of the warm-up (0: none).
        warmup_start: the warm-up's starting fraction of ``lr``.
        decay_epochs: increasing epochs at which the rate is multiplied by
            ``decay_factor``.
    """

    def __init__(self, lr, steps_per_epoch, warmup_epochs=0.0, warmup_start=0.1, decay_epochs=(), decay_factor=0.1):
        self.lr, self.warmup_start, self.decay_factor = lr, warmup_start, decay_factor
        self.warmup_steps = round(warmup_epochs * steps_per_epoch)
        self.decay_steps = [round(e * steps_per_epoch) for e in decay_epochs]

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            s = self.warmup_start
            return self.lr * (s + (1 - s) * step / self.warmup_steps)
        return self.lr * self.decay_factor ** bisect.bisect_right(self.decay_steps, step)

    def apply(self, optimizer, step: int):
        """Set every parameter group of ``optimizer`` to step ``step``'s rate."""
        lr = self(step)
        for group in optimizer.param_groups:
            group["lr"] = lr
        return lr
