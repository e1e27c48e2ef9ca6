"""Eager-SGD (Li et al., PPoPP 2020): gradient averaging with solo or majority partial allreduces."""

from collectives import majority_allreduce, solo_allreduce

from ..options.algorithms import EagerSGDOptions
from .base import Algorithm

__all__ = ["EagerSGD"]

_QUORUMS = {"solo": solo_allreduce, "majority": majority_allreduce}


class EagerSGD(Algorithm):
    """Synchronous-looking SGD whose gradient allreduce does not wait for late ranks.

    Step t: the gradients of step t are this rank's contribution to version t
    of a partial allreduce over all P ranks (WAGMA paper, section 2.2: "at
    most half of the processes contribute stale gradients if not ready"):
    with ``quorum="solo"`` the first rank to arrive starts it, with
    ``"majority"`` it starts once ceil(P/2) ranks have arrived.  Every rank
    then applies the same average (the sum over the P contributions divided
    by P), so the replicas stay identical, as in Allreduce-SGD.

    Between ``backward()`` and :meth:`step` the gradients are this rank's
    own: the partial collective runs in :meth:`step`, and a version may
    begin before this rank arrives, so no callback at the end of backward
    could wait for it without giving up what eager-SGD is for.  Clipping
    there clips this rank's contribution.  With a ``GradScaler``, let
    ``algo.step(scaler)`` unscale (do not call ``unscale_`` before it): it
    unscales the average, which holds an inf or NaN on every rank if it
    does on one, so every rank skips the same steps.  A carried-over
    gradient was scaled with the scale of the step that computed it: after
    a skipped step halved the scale, it is unscaled with the new one (twice
    its size, once; the scale changes only at a skip or after
    ``growth_interval`` steps).

    A late rank's gradient is carried over, never lost nor counted twice
    (``carry_over`` of :class:`~collectives.WaitAvoidingGroupAllreduce`): a
    version that begins before the rank arrives takes zeros from it, and
    the gradient it then computes enters the next version, added to that
    step's gradient if the rank arrives in time for it.  Reading chosen:
    eager-SGD's reference implementation (Li et al., PPoPP 2020) copies each
    gradient into the send buffer and zeroes it after the collective, so a
    version activated without the rank reads zeros and the late gradient
    goes to the next one; here a rank that misses several versions in a row
    accumulates its gradients instead of overwriting them, so that over a
    run the sum of the averages applied is exactly the sum of the gradients
    computed divided by P, less what the last version did not take
    (:attr:`unapplied`).  An earlier reading, re-sending a late rank's
    previous gradient to every version it missed, counted that gradient
    once per missed version: on 2 ranks with non-IID shards the constant
    pull kept the loss at 1.78 (from 2.33) in about half of the runs.
    :attr:`stale_steps` counts the steps at which this rank's gradient of
    that step was not in that step's version.

    Options (:class:`~wagma.options.algorithms.EagerSGDOptions`):
    ``quorum``, ``"solo"`` or ``"majority"``.
    """

    name = "eager_sgd"
    Options = EagerSGDOptions

    def __init__(self, model, optimizer, comm, **options):
        super().__init__(model, optimizer, comm, **options)
        self.quorum = self.config.quorum
        self._collectives = None
        self.unapplied = {}

    def _step(self):
        t = self.steps
        self.flat.attach_grads()        # gradients optimizer.zero_grad() set to None
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
        self._optimizer_step()

    def close(self):
        """Close the collectives (collective); :attr:`unapplied` then holds,
        per dtype, this rank's carried gradient that no version took (the
        sum of its gradients computed after its last contribution was
        consumed), or None."""
        for dtype, collective in (self._collectives or {}).items():
            collective.close()
            self.unapplied[dtype] = collective.unconsumed()
        self._collectives = None
        super().close()
