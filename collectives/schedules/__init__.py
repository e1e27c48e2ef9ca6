"""Allreduce schedules on point-to-point messages and the choice between them.

``blocking`` is the public entry point (:func:`~.blocking.allreduce` and its
persistent form :func:`~.blocking.allreduce_init`, :func:`~.blocking.reduce_scatter`,
:func:`~.blocking.allgather`, :func:`~.blocking.broadcast`, and what ``algorithm="auto"`` runs); the
schedules themselves are ``ring`` (ring ReduceScatter / Allgather / Allreduce),
``halving_doubling`` (Rabenseifner and recursive doubling for any rank count)
and ``library`` (the MPI library's own ``MPI_Allreduce`` as the schedule
``"mpi"``); ``partition`` cuts a buffer into blocks, one per rank; ``tuning``
reads the measured tables that ``"auto"`` consults.
"""

from .blocking import (
    ALLGATHER_ALGORITHMS,
    ALLREDUCE_ALGORITHMS,
    ALLREDUCE_CHOICES,
    OPS,
    REDUCE_SCATTER_ALGORITHMS,
    AllgatherAlgorithm,
    AllreduceAlgorithm,
    AllreduceChoice,
    AllreduceSchedule,
    Op,
    PersistentAllreduce,
    ReduceScatterAlgorithm,
    allgather,
    allreduce,
    allreduce_init,
    broadcast,
    choose_allreduce,
    reduce_scatter,
)
from .partition import block_offsets

__all__ = [
    "ALLGATHER_ALGORITHMS",
    "ALLREDUCE_ALGORITHMS",
    "ALLREDUCE_CHOICES",
    "AllgatherAlgorithm",
    "AllreduceAlgorithm",
    "AllreduceChoice",
    "AllreduceSchedule",
    "OPS",
    "Op",
    "PersistentAllreduce",
    "REDUCE_SCATTER_ALGORITHMS",
    "ReduceScatterAlgorithm",
    "allgather",
    "allreduce",
    "allreduce_init",
    "block_offsets",
    "broadcast",
    "choose_allreduce",
    "reduce_scatter",
]
