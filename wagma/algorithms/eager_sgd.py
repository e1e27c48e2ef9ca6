"""Eager-SGD (Li et al., PPoPP 2020): gradient averaging with solo or majority partial allreduces."""

from collectives import majority_allreduce, solo_allreduce

from .base import Algorithm

__all__ = ["EagerSGD"]

_QUORUMS = {"solo": solo_allreduce, "majority": majority_allreduce}


class EagerSGD(Algorithm):
    """Synchronous-looking SGD whose gradient allreduce does not wait for late ranks.

    Step t: the gradients of step t are this rank's contribution to version t
    of a partial allreduce over all P ranks (WAGMA paper, section 2.2: "at
    most half of the processes contribute stale gradients if not ready"):
    with ``quorum="solo"`` the first rank to arrive starts it, with
    ``"majority"`` it starts once ceil(P/2) ranks have arrived.  A rank that
    arrives after version t began contributes the gradient it published
    before (its previous one).  Every rank then applies the same average
    (the sum over the P contributions divided by P), so the replicas stay
    identical, as in Allreduce-SGD; parameters and buffers are broadcast from
    rank 0 at construction.

    Reading chosen: the late rank's own step-t gradient is published and
    serves a later version only if that one also starts before the rank
    arrives; it is not added to its next contribution (the sources here do
    not say that it should be).  :attr:`stale_steps` counts the steps at
    which this rank's contribution was stale.

    Args:
        quorum: ``"solo"`` or ``"majority"``.
    """

    name = "eager_sgd"

    def __init__(self, model, optimizer, comm, *, quorum="majority"):
        super().__init__(model, optimizer, comm, quorum=quorum)
        self._broadcast_from_root()
        self.quorum = quorum
        self._collectives = None

    @classmethod
    def check_options(cls, world_size, *, quorum):
        if quorum not in _QUORUMS:
            return f"quorum must be one of {', '.join(map(repr, _QUORUMS))}, got {quorum!r}"
        if world_size & (world_size - 1):
            return f"eager_sgd needs a power-of-two number of ranks, got {world_size}"
        return None

    def _step(self):
        t = self.steps
        self.flat.check_views()
        if self._collectives is None:   # opened here so a resumed run starts at t
            self._collectives = {
                dtype: _QUORUMS[self.quorum](self.comm.data, grad, op="avg",
                                             first_iteration=t).open()
                for dtype, grad in self.flat.grads.items()}
        for dtype, grad in self.flat.grads.items():
            # The gradient buffer is lent (a late rank's previous gradient);
            # the gradients move to the result buffer.
            result = self._collectives[dtype].allreduce(grad, t)
            self.flat.rebind(dtype, grads=result.value)
            if not result.fresh:
                self.stale_steps += 1
        self.optimizer.step()

    def close(self):
        for collective in (self._collectives or {}).values():
            collective.close()
        self._collectives = None
