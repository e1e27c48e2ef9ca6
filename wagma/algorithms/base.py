"""The interface every training algorithm implements, and its argument checks."""

import contextlib
import inspect
import time
import zlib

import numpy as np
import torch

from collectives import Communicator, broadcast
from collectives.agreement import agree
from collectives.straggler_sync import PredictedStragglerSync

from ..algorithm_options import SYNCS
from ..flat import FlatParameters
from ..reallocation import Reallocation

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
        samples_per_step: this rank's batch for the next step; the
            training loop's ``--batch-size`` unless the algorithm reallocates
            work (``reallocate``, :mod:`wagma.reallocation`).
        work_measured: with ``reallocate`` (EnsembleSync: always, for its
            reports), one ``(samples, seconds)`` pair per global
            synchronization: this rank's work (see :meth:`step`) since the
            previous one, whose ``samples / seconds`` is the speed the next
            shares are computed from.
        total_steps: the run's steps (set by :meth:`plan`).

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
        self.total_steps, self.samples_per_step, self._policy = None, None, None
        self._period_samples, self._period_seconds, self._returned = 0, 0.0, None
        self.work_measured = []
        self.straggler_sync = None
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

    @staticmethod
    def _sync_problem(sync):
        """The problem with a ``sync`` option, or None."""
        if sync not in SYNCS:
            return f"sync must be one of {', '.join(map(repr, SYNCS))}, got {sync!r}"
        return None

    @classmethod
    def check_options(cls, world_size, **options):
        """The first problem with ``options`` on ``world_size`` ranks, as a
        sentence naming the keyword, or None.  Pure: no model, no MPI."""
        return None

    def plan(self, total_steps: int, batch_size: int):
        """Told by the training loop before the first step: the run's number
        of steps and the per-rank batch (the shares' budget is ``size *
        batch_size`` when the algorithm reallocates)."""
        self.total_steps, self.samples_per_step = total_steps, batch_size
        if self.options.get("reallocate"):
            self._policy = Reallocation(self.comm.size, batch_size)

    def step(self):
        """One training step, after ``backward()``: the optimizer step and
        whatever communication the algorithm does at this step.

        Also times the rank's work for the reallocation: the seconds from
        the end of the previous call to the start of this one (data,
        forward, backward, injected delays; not the communication inside
        :meth:`step`) and the samples of the step.  A step whose start was
        not seen (the first, without :meth:`start_step_timer`) counts
        neither its seconds nor its samples."""
        entered = time.perf_counter()
        if self._returned is not None:
            self._period_seconds += entered - self._returned
            self._period_samples += self.samples_per_step or 0
        self._step()
        self.steps += 1
        self._returned = time.perf_counter()

    def start_step_timer(self):
        """Called by a training loop where a step's work begins (its data,
        forward, backward): what the loop does between steps (evaluations,
        writing results) then does not count as this rank's work for the
        reallocation.  Without it, the work is timed from the last step's end."""
        self._returned = time.perf_counter()

    def _period_done(self):
        """The samples and seconds measured since the last call, also
        appended to :attr:`work_measured`, and a fresh count."""
        measured = (self._period_samples, self._period_seconds)
        self.work_measured.append(measured)
        self._period_samples, self._period_seconds = 0, 0.0
        return measured

    def _reallocate(self):
        """At a global synchronization, with ``reallocate``: every rank's
        samples and step seconds since the last one (one allgather of two
        numbers on the control channel) and the policy's shares for the next
        period (Lemma 1; the same on every rank)."""
        measured = np.array(self.comm.control.allgather(self._period_done()))
        self.samples_per_step = int(self._policy.update(measured[:, 0], measured[:, 1])[self.comm.rank])

    def _open_straggler_sync(self, sync, templates):
        """With ``sync="stragglar"``: the :class:`~collectives.straggler_sync.
        PredictedStragglerSync` of the global averages over ``templates``
        (averaging, op ``avg``), kept in :attr:`straggler_sync`."""
        if sync == "stragglar":
            self.straggler_sync = PredictedStragglerSync(self.comm, templates, op="avg")
        return self.straggler_sync

    def sync_tables(self) -> dict:
        """Tables for the run file's ``sync/`` group, ``name -> (rows,
        columns)``: the straggler predictor's log with ``sync="stragglar"``
        (one row per global synchronization)."""
        if self.straggler_sync is None:
            return {}
        return {"stragglers": (self.straggler_sync.rows(), list(self.straggler_sync.COLUMNS))}

    def _step(self):
        raise NotImplementedError

    def close(self):
        """Release threads and communicators the algorithm holds (collective)."""
        if self.straggler_sync is not None:
            self.straggler_sync.close()
            self.straggler_sync = None

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
        # Options added since the state was saved read as their defaults.
        saved = {**self._option_defaults(), **state.get("options", {})}
        if saved != self.options:
            raise ValueError(f"state_dict options {state.get('options')} differ from "
                             f"this run's {self.options}")
        self.steps = int(state["steps"])

    @classmethod
    def _option_defaults(cls) -> dict:
        """The keyword options of this class that have defaults."""
        return {p.name: p.default for p in inspect.signature(cls).parameters.values()
                if p.kind is p.KEYWORD_ONLY and p.default is not p.empty}

    def __repr__(self):
        options = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
        return f"{type(self).__name__}({options}; step {self.steps}, {self.flat!r})"
