"""The interface every training algorithm implements, and its argument checks."""

import contextlib
import zlib

import torch

from collectives import Communicator, broadcast
from collectives.agreement import agree

from ..flat import FlatParameters

__all__ = ["Algorithm"]


class Algorithm:
    """A distributed training algorithm over a model's flat parameter buffer.

    Wraps a local ``torch.optim`` optimizer and the model; the training loop
    calls :meth:`step` after ``loss.backward()`` instead of
    ``optimizer.step()``.  The algorithm owns its step counter, increments it
    in :meth:`step` alone, and keeps it in :meth:`state_dict` so that a
    resumed run continues the same schedule.

    Construction flattens the model (:class:`~wagma.flat.FlatParameters`)
    and is collective over ``comm``: every rank checks its own arguments, and
    one agreement round raises the same error on every rank if any rank's
    are bad or differ (options, parameter names, shapes and dtypes).

    Subclasses set :attr:`name`, validate their options against the world
    size in the class method :meth:`check_options` (a problem sentence or
    None; it needs no model or communicator, so a command line can be
    checked before anything is built) and implement
    :meth:`_step` (the optimizer step and the communication of one step).

    Attributes a training loop may read:
        steps: steps taken (the counter of :meth:`state_dict`).
        stale_steps: steps whose contribution was stale (a group or quorum
            collective began without this rank); 0 for algorithms without
            partial collectives.
        lock: a context manager held while the parameters must not be read
            half-updated; algorithms whose own threads change the parameters
            (AD-PSGD) replace this no-op with their lock.

    Args:
        model: the ``torch.nn.Module``, parameters on one device.
        optimizer: a ``torch.optim.Optimizer`` over exactly the model's
            parameters.
        comm: a :class:`~collectives.comm.Communicator`.
        **options: the algorithm's own options.
    """

    name = "algorithm"

    def __init__(self, model, optimizer, comm, **options):
        if not isinstance(comm, Communicator):
            raise TypeError(f"comm must be a collectives.Communicator, got {type(comm).__name__}")
        self.model, self.optimizer, self.comm = model, optimizer, comm
        self.options = options
        self.steps = 0
        self.stale_steps = 0
        self.lock = contextlib.nullcontext()
        problem = self._check_model_and_optimizer() or self.check_options(comm.size, **options)
        layout = [(name, tuple(p.shape), str(p.dtype)) for name, p in model.named_parameters()]
        agree(comm, self.name, problem, ValueError,
              options=sorted(options.items()),
              parameters=zlib.crc32(repr(layout).encode()))
        self.flat = FlatParameters(model)

    def _broadcast_from_root(self):
        """Start every rank from rank 0's parameters and buffers (collective)."""
        for tensor in (*self.flat.params.values(), *self.flat.buffers.values()):
            broadcast(tensor, comm=self.comm, root=0)

    def _check_model_and_optimizer(self):
        if not isinstance(self.model, torch.nn.Module):
            return f"model must be a torch.nn.Module, got {type(self.model).__name__}"
        if not isinstance(self.optimizer, torch.optim.Optimizer):
            return f"optimizer must be a torch.optim.Optimizer, got {type(self.optimizer).__name__}"
        devices = sorted({str(p.device) for p in self.model.parameters()})
        if len(devices) != 1:
            return f"model parameters must all be on one device, got {', '.join(devices) or 'none'}"
        owned = {id(p) for group in self.optimizer.param_groups for p in group["params"]}
        model = {id(p) for p in self.model.parameters()}
        if owned != model:
            return ("optimizer must own exactly the model's parameters "
                    f"({len(model - owned)} of the model's are missing from it, "
                    f"{len(owned - model)} of its are not the model's)")
        return None

    @classmethod
    def check_options(cls, world_size, **options):
        """The first problem with ``options`` on ``world_size`` ranks, as a
        sentence naming the keyword, or None.  Pure: no model, no MPI."""
        return None

    def step(self):
        """One training step, after ``backward()``: the optimizer step and
        whatever communication the algorithm does at this step."""
        self._step()
        self.steps += 1

    def _step(self):
        raise NotImplementedError

    def close(self):
        """Release threads and communicators the algorithm holds (collective)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def zero_grad(self):
        """Zero the gradients, keeping them views of the flat buffer."""
        self.flat.zero_grad()

    def state_dict(self) -> dict:
        """The algorithm's counters and options (not the model or optimizer)."""
        return {"algorithm": self.name, "steps": self.steps, "options": dict(self.options)}

    def load_state_dict(self, state: dict):
        if state.get("algorithm") != self.name:
            raise ValueError(f"state_dict is for algorithm {state.get('algorithm')!r}, "
                             f"not {self.name!r}")
        if state.get("options") != self.options:
            raise ValueError(f"state_dict options {state.get('options')} differ from "
                             f"this run's {self.options}")
        self.steps = int(state["steps"])

    def __repr__(self):
        options = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
        return f"{type(self).__name__}({options}; step {self.steps}, {self.flat!r})"
