"""The replicas of one model across ranks: checking that they have the same parameters, and making them equal."""

from __future__ import annotations

import zlib

import numpy as np
import torch
from mpi4py import MPI

from collectives import Communicator, broadcast

__all__ = ["broadcast_model", "parameter_layout", "require_communicator", "same_parameters_problem"]


def require_communicator(comm: object) -> None:
    """Raise ``TypeError`` unless ``comm`` is a :class:`collectives.comm.Communicator`,
    saying how to make one of what was passed (no communication: a wrong
    ``comm`` cannot carry an agreement, and every rank of an SPMD program
    passes the same kind of object)."""
    if isinstance(comm, Communicator):
        return
    if isinstance(comm, MPI.Comm):
        raise TypeError(
            f"comm must be a collectives.Communicator, got the mpi4py communicator {comm!r}: "
            f"pass collectives.Communicator(comm), e.g. Communicator(MPI.COMM_WORLD) (it "
            f"duplicates the communicator, so the algorithm's messages cannot meet yours)"
        )
    raise TypeError(
        f"comm must be a collectives.Communicator, e.g. Communicator(MPI.COMM_WORLD), "
        f"got {type(comm).__module__}.{type(comm).__qualname__}"
    )


def parameter_layout(model: torch.nn.Module) -> list[tuple[str, tuple, str, bool]]:
    """``(name, shape, dtype, requires_grad)`` of each parameter, in order."""
    return [
        (name, tuple(p.shape), str(p.dtype).removeprefix("torch."), p.requires_grad)
        for name, p in model.named_parameters()
    ]


def _describe(entry) -> str:
    name, shape, dtype, trainable = entry
    return f"{name} {shape} {dtype}{'' if trainable else ' frozen'}"


def same_parameters_problem(comm: Communicator, model: torch.nn.Module) -> str | None:
    """None when every rank's model has the same parameters (names, shapes,
    dtypes, which are frozen); else a sentence naming the first parameter
    that differs and what each rank has there.  Collective over ``comm``'s
    control channel: one allreduce of two integers, and an allgather of the
    layouts only when they differ."""
    layout = parameter_layout(model)
    digest = zlib.crc32(repr(layout).encode())
    extremes = np.array([digest, -digest], dtype=np.int64)
    comm.control.Allreduce(MPI.IN_PLACE, extremes, op=MPI.MAX)
    if extremes[0] == -extremes[1]:
        return None
    layouts = comm.control.allgather(layout)
    index = next(
        i for i in range(max(map(len, layouts))) if len({repr(lay[i]) if i < len(lay) else None for lay in layouts}) > 1
    )
    seen = "; ".join(
        f"rank {r}: " + (_describe(lay[index]) if index < len(lay) else f"none (it has {len(lay)})")
        for r, lay in enumerate(layouts)
    )
    return f"the model's parameters differ across ranks; parameter {index} is {seen}"


def broadcast_model(comm: Communicator, model: torch.nn.Module, root: int = 0) -> None:
    """Make every rank's parameters and buffers (BatchNorm statistics)
    rank ``root``'s, in place: what DDP does at construction.  Collective;
    the ranks' layouts must agree (:func:`same_parameters_problem`)."""
    with torch.no_grad():
        for tensor in (*model.parameters(), *model.buffers()):
            if tensor.is_contiguous():
                broadcast(tensor.data, comm=comm, root=root, check=False)
            else:
                staged = tensor.data.contiguous()
                broadcast(staged, comm=comm, root=root, check=False)
                tensor.data.copy_(staged)
