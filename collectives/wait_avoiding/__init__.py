"""WAGMA-SGD's communication: butterfly groups, the group allreduce, and the wait-avoiding engine.

``groups`` is Algorithm 1 (which ranks average together at iteration t, no
MPI) and ``group_allreduce`` the blocking allreduce within those groups
(``persistent_group``: bound to one buffer, checked once).  The
wait-avoiding engine is the rest: ``collective``
(:class:`~collectives.wait_avoiding.collective.WaitAvoidingGroupAllreduce` and eager-SGD's
``solo_allreduce`` / ``majority_allreduce``, section 3.1 of the WAGMA paper),
``activation`` (binomial activation trees, the forwarding rule and version
tags, no MPI) and ``progress`` (the thread that receives activations and
executes versions).
"""

from .collective import (
    ACTIVATIONS,
    LATE,
    WAITS,
    Activation,
    GroupResult,
    Late,
    WaitAvoidingGroupAllreduce,
    Waits,
    majority_allreduce,
    resolve_waits,
    solo_allreduce,
)
from .group_allreduce import GroupAllreduceAlgorithm, group_allreduce
from .groups import ButterflyGrouping, butterfly_groups, butterfly_partners
from .persistent_group import PersistentGroupAllreduce, group_allreduce_init

__all__ = [
    "ACTIVATIONS",
    "Activation",
    "LATE",
    "Late",
    "WAITS",
    "Waits",
    "ButterflyGrouping",
    "GroupAllreduceAlgorithm",
    "GroupResult",
    "PersistentGroupAllreduce",
    "WaitAvoidingGroupAllreduce",
    "butterfly_groups",
    "butterfly_partners",
    "group_allreduce",
    "group_allreduce_init",
    "majority_allreduce",
    "resolve_waits",
    "solo_allreduce",
]
