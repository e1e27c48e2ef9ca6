"""Training algorithms by name: one interface, driven by ``step()`` after ``backward()``."""

from typing import Any

import torch

from collectives.agreement import agree
from collectives.comm import Communicator

from ..options import AlgorithmName
from ..replicas import require_communicator
from .adpsgd import ADPSGD
from .allreduce_sgd import AllreduceSGD
from .base import Algorithm
from .diloco import DiLoCo
from .dpsgd import DPSGD
from .eager_sgd import EagerSGD
from .ensemble_sync import EnsembleSync
from .hierarchical_sgd import HierarchicalSGD
from .local_sgd import LocalSGD
from .sgp import SGP
from .streaming_diloco import StreamingDiLoCo
from .wagma_sgd import WagmaSGD

__all__ = [
    "ADPSGD",
    "ALGORITHMS",
    "Algorithm",
    "AllreduceSGD",
    "DPSGD",
    "DiLoCo",
    "EagerSGD",
    "EnsembleSync",
    "HierarchicalSGD",
    "LocalSGD",
    "SGP",
    "StreamingDiLoCo",
    "WagmaSGD",
    "create",
]

#: Algorithms by the name the CLI and the Slurm scripts use.
ALGORITHMS = {
    cls.name: cls
    for cls in (
        ADPSGD,
        AllreduceSGD,
        DiLoCo,
        DPSGD,
        EagerSGD,
        EnsembleSync,
        HierarchicalSGD,
        LocalSGD,
        SGP,
        StreamingDiLoCo,
        WagmaSGD,
    )
}


def create(
    name: AlgorithmName,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    comm: Communicator,
    *,
    init_sync: bool = True,
    **options: Any,
) -> Algorithm:
    """Build the algorithm called ``name``; collective over ``comm``.

    Args:
        name: one of :data:`ALGORITHMS`.
        model, optimizer, comm, init_sync: as for :class:`~wagma.algorithms.base.Algorithm`.
        **options: the algorithm's options (:mod:`wagma.options`; every
            one has a default).

    Raises:
        TypeError: ``comm`` is not a :class:`collectives.comm.Communicator`
            (before any communication; the message says how to make one).
        ValueError: on every rank, when any rank names an unknown algorithm
            (the message lists the known ones) or passes bad options (it
            names the option and the accepted values).
    """
    require_communicator(comm)
    problem = (
        None if name in ALGORITHMS else f"algorithm must be one of {', '.join(map(repr, ALGORITHMS))}, got {name!r}"
    )
    agree(comm, "wagma.algorithms.create", problem, ValueError, algorithm=name)
    return ALGORITHMS[name](model, optimizer, comm, init_sync=init_sync, **options)
