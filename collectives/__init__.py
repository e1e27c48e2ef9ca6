"""Communication schedules on mpi4py: bandwidth-efficient allreduce, butterfly groups, wait-avoiding group
allreduce, StragglAR."""

from .blocking import allgather, allreduce, broadcast, reduce_scatter
from .comm import Communicator
from .group_allreduce import group_allreduce
from .groups import ButterflyGrouping, butterfly_groups, butterfly_partners
from .partition import block_offsets
from .stragglar.runtime import StragglerAwareAllreduce, stragglar_allreduce
from .wait_avoiding import (
    GroupResult,
    WaitAvoidingGroupAllreduce,
    majority_allreduce,
    solo_allreduce,
)

__all__ = [
    "ButterflyGrouping",
    "GroupResult",
    "WaitAvoidingGroupAllreduce",
    "Communicator",
    "StragglerAwareAllreduce",
    "allgather",
    "allreduce",
    "block_offsets",
    "broadcast",
    "butterfly_groups",
    "butterfly_partners",
    "group_allreduce",
    "majority_allreduce",
    "reduce_scatter",
    "solo_allreduce",
    "stragglar_allreduce",
]
