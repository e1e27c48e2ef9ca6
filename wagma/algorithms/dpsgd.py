"""D-PSGD (Lian et al., NeurIPS 2017): synchronous gossip on a ring, weights 1/3."""

from collectives.neighbors import neighbor_sum

from ..options.algorithms import DPSGDOptions
from .base import Algorithm

__all__ = ["DPSGD", "RING_OFFSETS", "RING_WEIGHT"]

#: The mixing of D-PSGD's ring; a rank adds the models of ranks r + o mod P,
#: in this order, to its own ...
RING_OFFSETS = (-1, 1)
#: ... and scales the sum by this weight (each of the three models 1/3).
RING_WEIGHT = 1.0 / 3.0


class DPSGD(Algorithm):
    """Decentralized parallel SGD on a ring.

    Step t follows the paper's Algorithm 1 (combine, then adapt): every rank
    replaces its model x_t by the average of its own and its two ring
    neighbours' (ranks r - 1 and r + 1 mod P, weight 1/3 each; the mixing
    matrix is symmetric and doubly stochastic, so the average over ranks is
    kept), then the local optimizer applies the gradient computed at x_t.
    The exchange is synchronous: each rank waits for both neighbours.  With
    P = 2 the two neighbours are the same rank (weights 1/3 and 2/3); with
    P = 1 nothing is exchanged.  Buffers (BatchNorm statistics) stay local.
    Between ``backward()`` and :meth:`~wagma.algorithms.base.Algorithm.step` the gradients are this rank's
    own (model averaging, by design): clipping clips the local gradient.
    """

    name = "dpsgd"
    Options = DPSGDOptions
    config: DPSGDOptions

    def _step(self):
        if self.comm.size > 1:
            for dtype, tensor in self.flat.params.items():
                compressor = self._compressor(("neighbours", dtype), tensor)
                neighbor_sum(tensor, comm=self.comm, offsets=RING_OFFSETS, check=False, compressor=compressor)
                if compressor is None:
                    self._bytes_counted += len(RING_OFFSETS) * tensor.numel() * tensor.element_size()
                tensor.mul_(RING_WEIGHT)
        self._optimizer_step()
