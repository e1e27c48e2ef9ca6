"""Stochastic Gradient Push (Assran et al., ICML 2019): push-sum on a time-varying exponential graph."""

from collections.abc import Mapping
from typing import Any

import torch

from collectives.comm import Communicator
from collectives.neighbors import neighbor_sum

from ..options.algorithms import SGPOptions
from .base import Algorithm

__all__ = ["SGP", "out_peer_offsets"]


def out_peer_offsets(t: int, peers: int, ranks: int) -> tuple[int, ...]:
    """The offsets 2**k of step t's out-peers on the exponential graph of
    ``ranks`` ranks: k = (t * peers + j) mod ceil(log2 P) for j < ``peers``."""
    rounds = max(1, (ranks - 1).bit_length())  # ceil(log2 P)
    return tuple(1 << ((t * peers + j) % rounds) for j in range(peers))


class SGP(Algorithm):
    """Push-sum gossip over the directed exponential graph, 1 or 2 peers per step.

    Each rank keeps a push-sum weight w (1 at the start) and its model as the
    de-biased z = x / w, at which gradients are taken.  Step t: the local
    optimizer updates z; then x = w z and w are pushed along the graph of
    step t: rank r sends (x, w) / (peers + 1) to ranks (r + 2**k) mod P for
    k = (t * peers + j) mod ceil(log2 P), j < peers, keeps the same share,
    and adds what it receives; finally z = x / w.  This is the update of the
    authors' implementation (optimizer on z, then gossip), which differs from
    the paper's x - lr * grad(z) only while w != 1.

    On this graph every rank receives exactly as many messages as it sends,
    so the mixing is doubly stochastic and w stays 1 (exactly, in floating
    point); it is carried anyway, so the algorithm stays push-sum if the
    graph is made irregular.  The sum of x over ranks is kept (mass
    conservation), and with one peer on P = 2**d ranks, d consecutive steps
    average exactly.  Buffers (BatchNorm statistics) stay local.
    Between ``backward()`` and :meth:`~wagma.algorithms.base.Algorithm.step` the gradients are this rank's
    own (model averaging, by design): clipping clips the local gradient.

    Options (:class:`~wagma.options.algorithms.SGPOptions`): ``peers``,
    out-peers per step, 1 to ceil(log2 P) (the paper runs 1 or 2).
    """

    name = "sgp"
    Options = SGPOptions
    config: SGPOptions

    def __init__(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, comm: Communicator, **options: Any
    ) -> None:
        super().__init__(model, optimizer, comm, **options)
        self.peers = self.config.peers
        self.weight = torch.ones(1, dtype=torch.float64)

    def out_peer_offsets(self, t: int) -> tuple[int, ...]:
        """The offsets 2**k of step t's out-peers (:func:`out_peer_offsets`)."""
        return out_peer_offsets(t, self.peers, self.comm.size)

    def _step(self):
        self._optimizer_step()
        if self.comm.size == 1:
            return
        # Receiving from r - 2**k is sending to r + 2**k.
        receive_from = tuple(-o for o in self.out_peer_offsets(self.steps))
        share = 1.0 / (self.peers + 1)
        w = self.weight.item()
        for dtype, tensor in self.flat.params.items():
            tensor.mul_(w * share)  # x / (peers + 1)
            compressor = self._compressor(("neighbours", dtype), tensor)
            neighbor_sum(tensor, comm=self.comm, offsets=receive_from, check=False, compressor=compressor)
            if compressor is None:
                self._bytes_counted += len(receive_from) * tensor.numel() * tensor.element_size()
        self.weight.mul_(share)
        neighbor_sum(self.weight, comm=self.comm, offsets=receive_from, check=False)
        for tensor in self.flat.params.values():
            tensor.div_(self.weight.item())  # z = x / w

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["weight"] = self.weight.item()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.weight.fill_(state["weight"])
