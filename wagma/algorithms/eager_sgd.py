"""Eager-SGD (Li et al., PPoPP 2020): gradient averaging with solo or majority partial allreduces."""

from typing import Any

import torch

from collectives import WaitAvoidingGroupAllreduce, majority_allreduce, solo_allreduce
from collectives.comm import Communicator
from collectives.compression import Compressor

from ..options.algorithms import EagerSGDOptions
from .base import Algorithm, held_compressors

__all__ = ["EagerSGD"]

#: ``quorum`` -> the activation of :func:`~collectives.majority_allreduce`.
_MAJORITY_ACTIVATION = {"majority": "random", "half": "half"}


class EagerSGD(Algorithm):
    """Synchronous-looking SGD whose gradient allreduce does not wait for late ranks.

    Step t: the gradients of step t are this rank's contribution to version t
    of a partial allreduce over all P ranks, and every rank applies the same
    result, the sum of the contributions it read divided by P, so the
    replicas stay identical, as in Allreduce-SGD.  What starts a version
    (``quorum``):

    - ``"solo"``: the first rank to arrive (``fflib2/src/colls/ffsolo_allreduce.c``
      of the authors' code, github ``Shigangli/eager-SGD``).
    - ``"majority"``: one rank per version, drawn from a seeded sequence the
      same on every rank (``activator_seed``); only its arrival starts the
      version.  That is the authors' majority allreduce
      (``colls/ffrand_allreduce.c``: ``rand_r(&seed) % P`` at every call,
      the seed shared, ``opt_esgd_majority_imagenet_imbalance.py``), in
      which half of the ranks arrive before a random one in expectation.
    - ``"half"``: once ceil(P/2) ranks have arrived, the reading of the
      WAGMA paper's words (section 2.2: eager-SGD "uses partial collective
      allreduces over the gradients, allowing at most half processors to
      contribute stale gradients if not ready"): a bound at every version,
      where the authors' code gives it on average.

    What becomes of a gradient whose version began without it (``late``):

    - ``"drop"`` (default): it is discarded, and the version read zeros
      from this rank; the divisor stays P.  That is what the authors' code
      does: its training scripts (``test-models/.../utils/opt_esgd_solo_imagenet_imbalance.py``
      and ``..._majority_...``) copy gradient / P into the send buffer, post
      the collective, wait, copy the result out, then zero the send buffer;
      the collective (``colls/ffallreduce.c``) reads the send buffer when a
      version starts, which for a late rank is in its progress thread, when
      a peer's activation arrives, while the buffer holds zeros; when the
      late rank arrives its activation is absorbed as already done
      (``ffop.c``'s version check), its wait returns the finished version,
      and the zeroing discards the gradient it had just copied in.  (The C
      code lets one through when another version starts between the copy
      and the zeroing, a race not reproduced here.)
    - ``"newest"``: it enters the next version, unless this rank arrives at
      that version in time, whose own gradient then replaces it: a late
      rank contributes its newest gradient, once (the papers' "stale
      gradients" read literally).
    - ``"accumulate"``: it enters the next version, added to every later
      gradient not yet applied, so that over a run the sum of the averages
      applied is exactly the sum of the gradients computed divided by P,
      less what the last version did not take (:attr:`unapplied`).  On 2
      ranks (digits, one random rank 20 ms late per step, 3 epochs, 3 seeds
      twice each) it ended at 76.9-89.7 %, the lowest and widest of the
      readings, where dropping ended at 84.1-93.9 % with the same
      activation (``results/eager_readings``, docs/fidelity.md): after a
      run of late versions one step applies a sum of older gradients.

    ``limiter`` N > 0: after every N partial versions one synchronous
    version that waits for every rank's fresh gradient (step t with (t + 1)
    mod (N + 1) == 0), as the authors' solo allreduce does with N = 32
    (``colls/ffsolo_limiter.c``); ``"auto"`` is 32 for solo and 0 for the
    others, whose reference has none.

    Between ``backward()`` and :meth:`~wagma.algorithms.base.Algorithm.step` the gradients are this rank's
    own: the partial collective runs in :meth:`~wagma.algorithms.base.Algorithm.step`, and a version may
    begin before this rank arrives, so no callback at the end of backward
    could wait for it without giving up what eager-SGD is for.  Clipping
    there clips this rank's contribution.  With a ``GradScaler``, let
    ``algo.step(scaler)`` unscale (do not call ``unscale_`` before it): it
    unscales the average, which holds an inf or NaN on every rank if it
    does on one, so every rank skips the same steps.  With ``"newest"`` or
    ``"accumulate"`` a gradient taken by a later version was scaled with
    the scale of the step that computed it: after a skipped step halved the
    scale, it is unscaled with the new one (twice its size, once; the scale
    changes only at a skip or after ``growth_interval`` steps).
    :attr:`~wagma.algorithms.base.Algorithm.stale_steps` counts the steps at which this rank's gradient of
    that step was not in that step's version.

    Options (:class:`~wagma.options.algorithms.EagerSGDOptions`):
    ``quorum``, ``late``, ``limiter``, ``activator_seed``.
    """

    name = "eager_sgd"
    Options = EagerSGDOptions
    #: Gradient averaging keeps the replicas equal, so the survivors of a dead rank take the
    #: most advanced survivor's model and optimizer state (:func:`wagma.membership.survive`).
    survivors_continue_from = "source"
    config: EagerSGDOptions

    def __init__(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, comm: Communicator, **options: Any
    ) -> None:
        super().__init__(model, optimizer, comm, **options)
        self._collectives: dict[torch.dtype, WaitAvoidingGroupAllreduce[torch.Tensor]] | None = None
        #: Per dtype, this rank's gradient that no version took, set by :meth:`close`.
        self.unapplied: dict[torch.dtype, torch.Tensor | None] = {}

    def _open(self, grad, t):
        """This dtype's partial collective, its versions numbered from step t."""
        config = self.config
        common = dict(
            op="avg", late=config.late, limiter=config.limiter, first_iteration=t, compression=config.compression
        )
        if config.quorum == "solo":
            return solo_allreduce(self.comm.data, grad, **common).open()
        return majority_allreduce(
            self.comm.data,
            grad,
            activation=_MAJORITY_ACTIVATION[config.quorum],
            activator_seed=config.activator_seed,
            **common,
        ).open()

    def _step(self):
        t = self.steps
        self.flat.attach_grads()  # gradients optimizer.zero_grad() set to None
        self.flat.check_views()
        if self._collectives is None:  # opened here so a resumed run starts at t
            self._collectives = {dtype: self._open(grad, t) for dtype, grad in self.flat.grads.items()}
        fresh, first = True, next(iter(self.flat.grads))
        for dtype, grad in self.flat.grads.items():
            collective = self._collectives[dtype]
            if self.compression == "none":
                self._count_allreduces(self.comm.size, [grad])
            if not collective.is_group_version(t):  # the limiter's synchronous version
                collective.sync_allreduce(grad, t, op="avg")
                self.contribution = t
                continue
            # The gradient buffer is lent (under "accumulate" or "newest" it
            # may be read by a later version); the gradients move to the result.
            result = collective.allreduce(grad, t)
            self.flat.rebind(dtype, grads=result.value)
            fresh &= result.fresh
            if dtype == first:
                self.contribution = result.contribution_iteration
        self.stale_steps += not fresh
        self._optimizer_step()

    def compressors(self) -> list[Compressor]:
        """The compressed streams of the partial collectives (versions and synchronous versions)."""
        return super().compressors() + held_compressors(self._collectives)

    def abandon(self) -> None:
        """Stop the progress threads without communicating (a dead rank);
        the gradients no version took are dropped with the step."""
        self._keep_bytes_of(self._collectives)
        for collective in (self._collectives or {}).values():
            collective.abandon()
        self._collectives = None
        super().abandon()

    def close(self) -> None:
        """Close the collectives (collective); :attr:`unapplied` then holds,
        per dtype, this rank's gradient that no version took (under
        ``"accumulate"`` the sum of its gradients computed after its last
        contribution was read, under ``"newest"`` the last one), or None."""
        self._keep_bytes_of(self._collectives)
        for dtype, collective in (self._collectives or {}).items():
            collective.close()
            self.unapplied[dtype] = collective.unconsumed()
        self._collectives = None
        super().close()
