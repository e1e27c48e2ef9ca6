"""AD-PSGD (Lian et al., ICML 2018): asynchronous pairwise gossip on a bipartite ring."""

import threading

from collectives.gossip import PairwiseGossip

from ..options.algorithms import ADPSGDOptions
from .base import Algorithm

__all__ = ["ADPSGD"]


class ADPSGD(Algorithm):
    """Asynchronous decentralized SGD: no rank ever waits for the others.

    The compute thread steps the local optimizer; a communication thread per
    rank averages the model with one ring neighbour at a time
    (:class:`~collectives.gossip.PairwiseGossip`): even ranks start an
    exchange after each of their steps, odd ranks serve their neighbours'
    requests.  An exchange replaces both models x_i, x_j by their average,
    applied as a difference to each side's current model, atomically against
    the local update (one lock around ``optimizer.step()`` and the averaging),
    so the sum of the models over ranks is unchanged by communication.
    Staleness is bounded: after its k-th step a rank waits until it has taken
    part in k - 1 exchanges (actives ask for one per step, passives are
    served one per step on average), so the exchange of step t overlaps step
    t + 1, and a compute loop faster than the network cannot leave the
    averaging arbitrarily far behind.  Needs an even number of ranks, all
    running the same number of steps.  :meth:`close` finishes every requested
    exchange on every rank.  Buffers (BatchNorm statistics) stay local.
    Between ``backward()`` and :meth:`step` the gradients are this rank's
    own (model averaging, by design): clipping clips the local gradient.
    """

    name = "adpsgd"
    Options = ADPSGDOptions

    def __init__(self, model, optimizer, comm, **options):
        super().__init__(model, optimizer, comm, **options)
        self.lock = threading.Lock()
        self.gossip = PairwiseGossip(comm.data, list(self.flat.params.values()),
                                     lock=self.lock).open()

    def _step(self):
        with self.lock:
            self._optimizer_step()
        self.gossip.step_done()

    def close(self):
        """Finish every requested exchange on every rank (collective)."""
        if self.gossip is not None:
            self.gossip.close()
            self.gossip = None
        super().close()
