"""Hierarchical SGD (seed 000, PyTorch's HierarchicalModelAverager): model averaging at several levels."""


from collectives import Communicator, allreduce

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

    One :class:`~collectives.comm.Communicator` per level below the top,
    made at construction (collective) and freed by :meth:`close`.

    Args:
        period_group_size_dict: ``{period: group_size}``, see above.
        warmup_steps: steps of gradient averaging before local steps, >= 0.
    """

    name = "hierarchical_sgd"

    def __init__(self, model, optimizer, comm, *, period_group_size_dict, warmup_steps=0):
        levels = dict(period_group_size_dict) if isinstance(period_group_size_dict, dict) \
            else period_group_size_dict
        super().__init__(model, optimizer, comm, period_group_size_dict=levels,
                         warmup_steps=warmup_steps)
        self.warmup_steps = warmup_steps
        self.levels = []
        for period, size in levels.items():
            if size == comm.size:
                group = comm
            else:
                split = comm.data.Split(comm.rank // size, comm.rank)
                group = Communicator(split)
                split.Free()
            self.levels.append((period, group))

    @classmethod
    def check_options(cls, world_size, *, period_group_size_dict, warmup_steps):
        levels = period_group_size_dict
        if not isinstance(levels, dict) or not levels:
            return f"period_group_size_dict must be a non-empty dict, got {levels!r}"
        periods, sizes = list(levels), list(levels.values())
        if any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in periods + sizes):
            return f"period_group_size_dict must map ints >= 1 to ints >= 1, got {levels!r}"
        if periods != sorted(set(periods)):
            return f"periods must be increasing, got {periods}"
        if sizes[-1] != world_size:
            return (f"the last group size in period_group_size_dict must be the world "
                    f"size {world_size}, got {sizes[-1]}")
        if any(world_size % s for s in sizes):
            return f"every group size must divide the world size {world_size}, got {sizes}"
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
            return f"warmup_steps must be an int >= 0, got {warmup_steps!r}"
        return None

    def averaging_level(self, t):
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
            for tensor in self.flat.grads.values():
                allreduce(tensor, comm=self.comm, op="avg")
        self.optimizer.step()
        group = self.averaging_level(t)
        if group is not None:
            for tensor in self.flat.params.values():
                allreduce(tensor, comm=group, op="avg")

    def close(self):
        for _, group in self.levels:
            if group is not self.comm:
                group.close()
        self.levels = []
