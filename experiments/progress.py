"""Rank 0's report of a run's progress: a bar on a terminal, log lines elsewhere."""

import contextlib
import logging
import sys

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

__all__ = ["StepProgress"]

logger = logging.getLogger(__name__)


class StepProgress:
    """The steps done of ``total``, with the last loss and the samples per second.

    Where stderr is a terminal: a tqdm bar, redrawn at most once a second,
    log records printed above it (:meth:`redirect`).  Anywhere else (a log
    file, a batch job's output, the pipe ``mpiexec`` gives its ranks) a bar's
    carriage returns would be noise: one log line per tenth of the run
    instead.  ``enabled`` False (other ranks, ``--no-progress``): nothing.
    """

    def __init__(self, total: int, start: int, enabled: bool, stream=None):
        stream = stream or sys.stderr
        self.total, self.enabled = total, enabled
        terminal = enabled and stream.isatty()
        self.bar = (
            tqdm(total=total, initial=start, unit="step", dynamic_ncols=True, mininterval=1.0, file=stream)
            if terminal
            else None
        )
        self._every = max(1, total // 10)
        self._next_line = (start // self._every + 1) * self._every

    def redirect(self):
        """A context in which log records go above the bar (a no-op without one)."""
        return logging_redirect_tqdm() if self.bar is not None else contextlib.nullcontext()

    def update(self, step: int, loss: float, samples_per_second: float):
        """``step`` steps are done."""
        if self.bar is not None:
            self.bar.update(step - self.bar.n)
            if self.bar.n % 10 == 0:
                self.bar.set_postfix(loss=f"{loss:.3f}", samples_s=f"{samples_per_second:.0f}")
        elif self.enabled and (step >= self._next_line or step == self.total):
            logger.info(
                "step %d of %d (%.0f %%): loss %.4f, %.0f samples/s",
                step,
                self.total,
                100 * step / self.total,
                loss,
                samples_per_second,
            )
            self._next_line = (step // self._every + 1) * self._every

    def close(self):
        if self.bar is not None:
            self.bar.close()
