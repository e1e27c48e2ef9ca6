"""The averaged model: what decentralized SGD is judged on, built in a copy without touching training."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from collectives import allreduce

if TYPE_CHECKING:
    from collectives import Communicator

__all__ = ["averaged_model", "averaged_replicas"]


def _averaged_state(model: torch.nn.Module) -> list[torch.Tensor]:
    """The tensors an average covers: parameters and floating-point buffers
    (BatchNorm's running statistics; not ``num_batches_tracked``)."""
    return [t for t in (*model.parameters(), *model.buffers()) if t.is_floating_point()]


def averaged_model(
    model: torch.nn.Module,
    comm: Communicator,
    *,
    into: torch.nn.Module | None = None,
    lock: contextlib.AbstractContextManager[Any] | None = None,
) -> torch.nn.Module:
    """The average of every rank's replica of ``model``, in a separate model.

    Every rank copies its parameters and floating-point buffers (BatchNorm
    statistics) into one float64 vector, the ranks average the vectors (one
    allreduce on ``comm``), and the mean is loaded into ``into`` (a deep
    copy of ``model`` made on the first call; pass it back in to reuse it).
    The training model is never touched.  Collective over ``comm``: give
    it a :class:`~collectives.comm.Communicator` of its own (not the
    algorithm's), so that evaluation cannot meet training's messages.

    For Allreduce-SGD and eager-SGD, whose replicas are equal, the average
    is the model; for the model-averaging family it is the consensus model
    the papers evaluate.

    Args:
        model: this rank's training model.
        comm: a :class:`~collectives.comm.Communicator` for evaluation.
        into: the model to load the average into; None: a new deep copy.
        lock: the algorithm's :attr:`~wagma.algorithms.base.Algorithm.lock`,
            held while reading the parameters (AD-PSGD's thread averages
            them concurrently).

    Returns:
        ``into``, holding the average (in training mode if ``model`` is).

    Example::

        with Communicator(MPI.COMM_WORLD) as eval_comm:
            average = averaged_model(model, eval_comm, lock=algo.lock)
            average.eval()
            accuracy = my_evaluate(average, test_loader)
    """
    into = copy.deepcopy(model) if into is None else into
    with torch.no_grad(), lock if lock is not None else contextlib.nullcontext():
        vector = torch.cat([t.detach().reshape(-1).to(torch.float64) for t in _averaged_state(model)])
    allreduce(vector, comm=comm, op="avg")
    return _load(into, vector)


def _load(into: torch.nn.Module, vector: torch.Tensor) -> torch.nn.Module:
    """Load ``vector`` into ``into``'s :func:`_averaged_state`; returns ``into``."""
    with torch.no_grad():
        offset = 0
        for t in _averaged_state(into):
            t.copy_(vector[offset : offset + t.numel()].view_as(t))
            offset += t.numel()
    return into


def averaged_replicas(models: Sequence[torch.nn.Module], *, into: torch.nn.Module | None = None) -> torch.nn.Module:
    """The average of replicas held in one process
    (:class:`wagma.emulate.emulator.Emulator`'s), with :func:`averaged_model`'s arithmetic: parameters and
    floating-point buffers as float64 vectors, summed in the order given,
    times 1 / count, loaded into ``into`` (a deep copy of ``models[0]``
    when None).  Returns ``into``."""
    into = copy.deepcopy(models[0]) if into is None else into
    with torch.no_grad():
        vectors = [torch.cat([t.detach().reshape(-1).to(torch.float64) for t in _averaged_state(m)]) for m in models]
        total = vectors[0]
        for vector in vectors[1:]:
            total += vector
        total *= 1.0 / len(models)
    return _load(into, total)
