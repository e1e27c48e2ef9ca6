"""Communication on mpi4py for model averaging: allreduce schedules, WAGMA-SGD's groups and
wait-avoiding engine, StragglAR, and the primitives they share.

Subpackages, one concept each: :mod:`collectives.schedules` (the blocking
allreduce, reduce-scatter and allgather schedules, and what ``"auto"`` picks),
:mod:`collectives.wait_avoiding` (butterfly groups, the group allreduce, the
wait-avoiding group allreduce and its progress thread),
:mod:`collectives.stragglar` (StragglAR's schedules, verifier, cost model,
runtime, straggler prediction and the synchronization used in training) and
:mod:`collectives.bench` (benchmarks).  The modules at this level are shared
by them: :class:`~collectives.comm.Communicator` (``comm``), buffers, argument agreement,
failure handling, polling back-off, run provenance, and the decentralized
exchanges (``neighbors``, ``gossip``, ``member_allreduce``, ``background``).

Nothing here imports torch at import time: torch tensors are handled when a
caller passes them.
"""

from .comm import Communicator
from .schedules import (
    PersistentAllreduce,
    allgather,
    allreduce,
    allreduce_init,
    block_offsets,
    broadcast,
    reduce_scatter,
)
from .stragglar.runtime import StragglerAwareAllreduce, stragglar_allreduce
from .wait_avoiding import (
    ButterflyGrouping,
    GroupResult,
    PersistentGroupAllreduce,
    WaitAvoidingGroupAllreduce,
    butterfly_groups,
    butterfly_partners,
    group_allreduce,
    group_allreduce_init,
    majority_allreduce,
    solo_allreduce,
)

__all__ = [
    "ButterflyGrouping",
    "GroupResult",
    "WaitAvoidingGroupAllreduce",
    "Communicator",
    "PersistentAllreduce",
    "PersistentGroupAllreduce",
    "StragglerAwareAllreduce",
    "allgather",
    "allreduce",
    "allreduce_init",
    "block_offsets",
    "broadcast",
    "butterfly_groups",
    "butterfly_partners",
    "group_allreduce",
    "group_allreduce_init",
    "majority_allreduce",
    "reduce_scatter",
    "solo_allreduce",
    "stragglar_allreduce",
]
