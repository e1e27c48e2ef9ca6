"""AD-PSGD (Lian et al., ICML 2018): asynchronous pairwise gossip on a bipartite ring."""

import threading
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from collectives.comm import Communicator
from collectives.gossip import PairwiseGossip

from ..options.algorithms import ADPSGDOptions
from .base import Algorithm

__all__ = ["ADPSGD"]


class ADPSGD(Algorithm):
    """Asynchronous decentralized SGD: no rank ever waits for the others.

    The compute thread steps the local optimizer; a communication thread per
    rank averages the model with one ring neighbour at a time
    (:class:`~collectives.gossip.PairwiseGossip`): even ranks start an
    exchange after each of their steps, the other ranks serve their
    neighbours' requests (on an odd ring rank P - 1 serves too, so that no
    two ranks that start exchanges are neighbours: no cycle of waits,
    :func:`~collectives.gossip.is_active`).  An exchange replaces both models x_i, x_j by their average,
    as a difference that each side adds to its model right after its next
    ``optimizer.step()`` (one lock around the step, the addition and the
    exchange's copies), so the sum of the models over ranks is unchanged by
    communication, and the gradient of a step is the one of the model its
    forward pass read whole (Lian et al., Algorithm 1: the gradient at x-hat,
    applied to the model as averaged meanwhile).
    Staleness is bounded: after its k-th step a rank waits until it has taken
    part in k - 1 exchanges (actives ask for one per step, passives are
    served one per step on average), so the exchange of step t overlaps step
    t + 1, and a compute loop faster than the network cannot leave the
    averaging arbitrarily far behind.  Any number of ranks, all running the
    same number of steps.  :meth:`close` finishes every requested
    exchange on every rank.  Buffers (BatchNorm statistics) stay local.
    Between ``backward()`` and :meth:`~wagma.algorithms.base.Algorithm.step` the gradients are this rank's
    own (model averaging, by design): clipping clips the local gradient.

    After :meth:`close`, rank 0's :meth:`sync_tables` holds every rank's
    exchanges (table ``exchanges``: rank, peer, active, copied_after,
    applied_after, in each rank's order; see
    :attr:`~collectives.gossip.PairwiseGossip.log`), which a run file keeps
    for :func:`wagma.emulate.schedule.logged_schedule`.
    """

    name = "adpsgd"
    Options = ADPSGDOptions
    config: ADPSGDOptions
    #: The columns of table ``exchanges``.
    EXCHANGE_COLUMNS = ("rank", "peer", "active", "copied_after", "applied_after")

    def __init__(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, comm: Communicator, **options: Any
    ) -> None:
        super().__init__(model, optimizer, comm, **options)
        self.lock = threading.Lock()
        self.gossip: PairwiseGossip[torch.Tensor] | None = PairwiseGossip(
            comm.data, list(self.flat.params.values()), lock=self.lock, compression=self.compression
        ).open()
        self._exchanges: np.ndarray | None = None

    def _step(self):
        with self.lock:
            self._optimizer_step()
            self.gossip.fold()
        self.gossip.step_done()

    def state_dict(self) -> dict[str, Any]:
        """The counters, options and the half differences not yet folded
        into the model (``pending``); take it holding :attr:`~wagma.algorithms.base.Algorithm.lock`, with the
        model's, so that the two add up to the model as it stands.  An
        exchange in flight then is not in either."""
        state = super().state_dict()
        if self.gossip is not None:
            state["pending"] = self.gossip.pending()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        if state.get("pending") is not None and self.gossip is not None:
            self.gossip.load_pending(state["pending"])

    def sync_tables(self) -> dict[str, tuple[np.ndarray, list[str]]]:
        tables = super().sync_tables()
        if self._exchanges is not None:
            tables["exchanges"] = (self._exchanges, list(self.EXCHANGE_COLUMNS))
        return tables

    @property
    def bytes_sent(self) -> float:
        """The bytes this rank sent in its exchanges (encoded where compressed)."""
        return self._bytes_counted + (self.gossip.bytes_sent if self.gossip is not None else 0)

    def abandon(self) -> None:
        """Stop the communication thread without communicating (a dead
        rank); the exchanges in flight are dropped."""
        if self.gossip is not None:
            self._bytes_counted += self.gossip.bytes_sent
            self.gossip.abandon()
            self.gossip = None
        super().abandon()

    def close(self) -> None:
        """Finish every requested exchange on every rank and gather their
        log on rank 0 (collective)."""
        if self.gossip is not None:
            self.gossip.close()
            self._bytes_counted += self.gossip.bytes_sent
            logs = self.comm.control.gather(self.gossip.log, root=0)
            if logs is not None:
                rows = [(rank, *entry) for rank, log in enumerate(logs) for entry in log]
                self._exchanges = np.array(rows, dtype=np.int64).reshape(-1, len(self.EXCHANGE_COLUMNS))
            self.gossip = None
        super().close()
