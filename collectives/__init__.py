"""Communication schedules on mpi4py: bandwidth-efficient allreduce, butterfly groups."""

from .blocking import allgather, allreduce, reduce_scatter
from .comm import Communicator
from .group_allreduce import group_allreduce
from .groups import ButterflyGrouping, butterfly_groups, butterfly_partners
from .partition import block_offsets

__all__ = [
    "ButterflyGrouping",
    "Communicator",
    "allgather",
    "allreduce",
    "block_offsets",
    "butterfly_groups",
    "butterfly_partners",
    "group_allreduce",
    "reduce_scatter",
]
