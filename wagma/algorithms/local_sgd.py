"""Local SGD: every rank trains alone and the models are averaged every ``period`` steps."""

from collectives import allreduce

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

    Args:
        period: tau >= 1.
        reallocate: after each average, Lemma 1's shares of the global
            batch for the next period (:mod:`wagma.reallocation`; one more
            allgather of two numbers per average).
        sync: ``"allreduce"`` or ``"stragglar"``: each average as StragglAR
            with the rank predicted to arrive last as its straggler
            (:mod:`collectives.straggler_sync`; the same average up to the
            order of the float additions, whoever arrives last).

    Example::

        algo = wagma.algorithms.create("local_sgd", model, optimizer, comm, period=8)
        for x, y in loader:
            algo.zero_grad()
            loss_fn(model(x), y).backward()
            algo.step()
    """

    name = "local_sgd"

    def __init__(self, model, optimizer, comm, *, period=1, reallocate=False, sync="allreduce"):
        super().__init__(model, optimizer, comm, period=period, reallocate=reallocate, sync=sync)
        self.period = period
        self._open_straggler_sync(sync, self.flat.params.values())

    @classmethod
    def check_options(cls, world_size, *, period, reallocate, sync):
        if isinstance(period, bool) or not isinstance(period, int) or period < 1:
            return f"period must be an int >= 1, got {period!r}"
        if not isinstance(reallocate, bool):
            return f"reallocate must be True or False, got {reallocate!r}"
        return cls._sync_problem(sync)

    def _step(self):
        self.optimizer.step()
        if (self.steps + 1) % self.period == 0:
            if self.straggler_sync is not None:
                self.straggler_sync(list(self.flat.params.values()))
            else:
                for tensor in self.flat.params.values():
                    allreduce(tensor, comm=self.comm, op="avg")
            if self._policy is not None:
                self._reallocate()
