"""The interface every training algorithm implements: construction, the training-loop contract, its checks."""

import contextlib
import copy
import inspect
import math
import time
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
import torch

from collectives import allreduce
from collectives.agreement import agree
from collectives.comm import Communicator
from collectives.compression import Compressor, compressed_allreduce, compressor_for
from collectives.failures import fault_tolerant, hold
from collectives.stragglar.training_sync import PredictedStragglerSync

from ..flat import FlatParameters
from ..membership import Membership
from ..options import options_problem
from ..options.base import Options as AlgorithmOptions
from ..options.base import keyword_signature
from ..outer import OuterOptimizer
from ..reallocation import Reallocation
from ..replicas import broadcast_model, require_communicator, same_parameters_problem

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self is Python 3.11's

__all__ = ["Algorithm"]


def allreduce_bytes(ranks: int, nbytes: int) -> float:
    """What one rank of a bandwidth-optimal allreduce of ``nbytes`` over
    ``ranks`` ranks sends: 2 (ranks - 1) / ranks of the buffer."""
    return 2 * (ranks - 1) / ranks * nbytes


def held_compressors(collectives: Mapping[Any, Any] | None) -> list[Compressor]:
    """The compressed streams of wait-avoiding collectives (their groups' and sync steps')."""
    return [c for wa in (collectives or {}).values() for c in (wa.compressor, wa.sync_compressor) if c is not None]


def _compression_problem(model: torch.nn.Module, compression: str) -> str | None:
    if compression == "none" or not isinstance(model, torch.nn.Module):
        return None
    other = sorted({str(p.dtype) for p in model.parameters() if p.requires_grad and p.dtype != torch.float32})
    if other:
        return f"compression {compression!r} needs float32 parameters, got {', '.join(other)}"
    return None


class Algorithm:
    """A distributed training algorithm over a model's flat parameter buffer.

    The training loop is DDP's with two changes: ``algo = create(name,
    model, optimizer, comm, ...)``, and :meth:`step` after
    ``loss.backward()`` in place of ``optimizer.step()`` (with
    :meth:`zero_grad`).  What a gradient holds between ``backward()`` and
    :meth:`step` is each algorithm's to say (its docstring): the global
    average for gradient averaging (Allreduce-SGD, as in DDP), this rank's
    own gradient for the model-averaging family, by design.  The algorithm
    owns its step counter, increments it in :meth:`step` alone, and keeps it
    in :meth:`state_dict` so that a resumed run continues the same schedule.

    Construction is collective over ``comm``, and checks before any data
    moves: every rank checks its own arguments, and one agreement round
    raises the same ``ValueError`` on every rank if any rank's are bad or
    differ (options; the parameters' names, shapes, dtypes and which are
    frozen, naming the first that differs).  Then:

    * the trainable parameters (``requires_grad``) become views into flat
      buffers (:class:`~wagma.flat.FlatParameters`); frozen parameters stay
      out of them, out of every hook and average: their gradients stay
      None and their values never change (an optimizer that owns them skips
      them: they have no gradient);
    * with ``init_sync`` (the default, as DDP's), every rank's parameters
      and buffers become rank 0's (:func:`~wagma.replicas.broadcast_model`),
      so the replicas start from one model whatever each rank's seed was.

    Misuse is caught where it is made: a ``comm`` that is not a
    :class:`~collectives.comm.Communicator` (``TypeError``, before any message),
    unknown options (the message lists the algorithm's), and an
    ``optimizer.step()`` called outside :meth:`step` (``RuntimeError`` at the
    next :meth:`step`, before it communicates).

    Subclasses set :attr:`name` and :attr:`Options` (the options object:
    names, defaults, documentation and checks, :mod:`wagma.options`), read
    their options from :attr:`config`, and implement ``_step`` (the
    optimizer step, through ``_optimizer_step``, and the communication
    of one step).

    The instance attributes documented below (set at construction) are
    those a training loop may read.

    Args:
        model: the ``torch.nn.Module``, parameters on one device.
        optimizer: a ``torch.optim.Optimizer`` that owns every trainable
            parameter of the model (and may own frozen ones, or not).
        comm: a :class:`~collectives.comm.Communicator`, e.g.
            ``Communicator(MPI.COMM_WORLD)``.
        init_sync: make the replicas rank 0's at construction (parameters
            and buffers).  False is an explicit opt-out for experiments that
            start the replicas from different models on purpose.
        **options: the algorithm's own options (:attr:`Options`).
    """

    name = "algorithm"
    #: The options object of the algorithm (:class:`wagma.options.base.Options`); every subclass sets it.
    Options: ClassVar[type[AlgorithmOptions]]
    #: The model the survivors of a dead rank continue from
    #: (:func:`wagma.membership.survive`): ``"own"``, each survivor its own
    #: replica as of its last completed step (model averaging: the replicas
    #: differ by design and the next average merges them), or ``"source"``,
    #: the model, buffers and optimizer state of the survivor that completed
    #: the most steps (gradient averaging: the replicas are equal after every
    #: step, so that is the last completed average).
    survivors_continue_from: ClassVar[Literal["own", "source"]] = "own"
    #: How the loop scores the model.  False (every algorithm but
    #: ensemble_sync): the ranks' average, collectively.  True: rank 0 alone
    #: scores :attr:`ensemble`, ``(step, parameters)`` of the last average it
    #: took part in (None before the first), and the others go on training.
    evaluates_ensemble = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        leading = [
            inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in ("model", "optimizer", "comm")
        ]
        leading.append(inspect.Parameter("init_sync", inspect.Parameter.KEYWORD_ONLY, default=True))
        cls.__signature__ = keyword_signature(cls.Options, leading)

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        comm: Communicator,
        *,
        init_sync: bool = True,
        **options: Any,
    ) -> None:
        require_communicator(comm)
        self.model, self.optimizer, self.comm = model, optimizer, comm
        #: The ranks the algorithm runs on and the changes so far (a dead
        #: rank, under MPI fault tolerance: :mod:`wagma.membership`).
        self.membership = Membership(comm.control, list(range(comm.size)))
        # Under fault tolerance, the model and optimizer state at the start
        # of the step in progress, to put back if the step fails half-way.
        self._survivable = fault_tolerant()
        self._before_step: tuple[list[torch.Tensor], dict[str, Any]] | None = None
        self._owned_comm: Communicator | None = None  # the survivors' communicator after a rebuild
        #: Steps taken (the counter of :meth:`state_dict`).
        self.steps = 0
        #: Steps whose contribution was stale (a group or quorum collective
        #: began without this rank); 0 for algorithms without partial
        #: collectives.
        self.stale_steps = 0
        #: After :meth:`step`, the iteration of the contribution this rank
        #: gave to the step's averaging, from the partial collective
        #: (WAGMA-SGD's model, eager-SGD's gradient: the step itself where
        #: fresh, an older one where stale; -1 for the initial model, or for
        #: zeros under a ``late`` reading; with several parameter dtypes, the
        #: first's); NaN for the others.  Run files keep it (step field
        #: ``contribution``), and :mod:`wagma.emulate` replays it.
        self.contribution = math.nan
        #: A context manager held while the parameters must not be read
        #: half-updated; algorithms whose own threads change the parameters
        #: (AD-PSGD) replace this no-op with their lock.
        self.lock: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
        #: The run's steps (set by :meth:`plan`).
        self.total_steps: int | None = None
        #: This rank's batch for the next step, the training loop's
        #: ``--batch-size`` unless the algorithm reallocates work
        #: (``reallocate``, :mod:`wagma.reallocation`).
        self.samples_per_step: int | None = None
        self._policy: Reallocation | None = None
        self._period_samples, self._period_seconds = 0, 0.0
        self._returned: float | None = None
        #: With ``reallocate`` (EnsembleSync always, for its reports), one
        #: ``(samples, seconds)`` pair per global synchronization: this
        #: rank's work (see :meth:`step`) since the previous one, whose
        #: ``samples / seconds`` is the speed the next shares are computed
        #: from.
        self.work_measured: list[tuple[int, float]] = []
        self.straggler_sync: PredictedStragglerSync | None = None
        #: The compressed streams, by what they average (the global average,
        #: a gradient bucket, a fragment...): their codec, error feedback and bytes.
        self._compressors: dict[tuple[Any, ...], Compressor] = {}
        self._bytes_counted = 0.0
        #: The outer optimizer of the global averages (DiLoCo's, and local
        #: SGD's and WAGMA-SGD's with ``outer_lr`` or ``outer_momentum``
        #: set: :mod:`wagma.outer`); None for plain averaging.
        self.outer: OuterOptimizer | None = None
        self._scaler: torch.amp.GradScaler | None = None
        self._inside_step, self._outside_steps = False, 0
        #: After :meth:`step`, the seconds the step's backward passes spent in
        #: the algorithm's communication (Allreduce-SGD's end-of-backward
        #: wait for its buckets); a training loop that times ``backward()``
        #: as compute moves them to the step's communication, where the
        #: waiting belongs.  0 for algorithms that communicate inside
        #: :meth:`step` only.
        self.comm_in_backward_s, self._comm_in_backward = 0.0, 0.0
        #: After a :meth:`step` that fast-forwarded this rank past steps it
        #: did not take (ensemble_sync's late rank rejoining), ``(first,
        #: stop)`` of the global steps skipped (the loop records them as
        #: skipped and moves its data past their samples); else None.
        self.skipped: tuple[int, int] | None = None
        #: On rank 0 of an algorithm whose :attr:`evaluates_ensemble` is
        #: True, ``(step, parameters)`` of the last average it took part in
        #: (None before the first); None elsewhere.
        self.ensemble: tuple[int, list[torch.Tensor]] | None = None
        #: After a :meth:`step` whose synchronization waited for every living
        #: member so that the dead still in the communicator be replaced
        #: (ensemble_sync's coordinator, :meth:`expect_replacements`), how many
        #: are dead, the same on every member at the same step, where the loop
        #: calls :func:`wagma.healing.replace`; else 0.  The other algorithms'
        #: dead leave by a shrink (:func:`wagma.membership.survive`).
        self.dead_to_replace = 0
        problem = (
            options_problem(self.name, comm.size, options)
            or self._check_model_and_optimizer()
            or _compression_problem(model, options.get("compression", "none"))
        )
        config = None if problem else self.Options(**options).resolve(comm.size)
        agree(
            comm,
            self.name,
            problem,
            ValueError,
            init_sync=init_sync,
            options=sorted(config.as_dict().items()) if config else None,
        )
        problem = same_parameters_problem(comm, model)
        if problem:
            raise ValueError(f"{self.name}: {problem}")
        assert config is not None  # made unless a problem, which agree raised
        #: The options object, "auto" values made concrete for the rank
        #: count.
        self.config = config
        #: :attr:`config` as a dict (the run file's ``algorithm_options``).
        self.options = config.as_dict()
        self.membership.options = dict(self.options)
        #: What the averages put on the wire (the ``compression`` option;
        #: ``"none"`` for the algorithms without it).
        self.compression: str = self.options.get("compression", "none")
        self.flat = FlatParameters(model)
        if init_sync:
            broadcast_model(comm, model)
        self._step_hook = optimizer.register_step_pre_hook(self._optimizer_stepping)

    def _check_model_and_optimizer(self):
        if not isinstance(self.model, torch.nn.Module):
            return f"model must be a torch.nn.Module, got {type(self.model).__name__}"
        if not isinstance(self.optimizer, torch.optim.Optimizer):
            return f"optimizer must be a torch.optim.Optimizer, got {type(self.optimizer).__name__}"
        devices = sorted({str(p.device) for p in self.model.parameters()})
        if len(devices) != 1:
            return f"model parameters must all be on one device, got {', '.join(devices) or 'none'}"
        owned = {id(p) for group in self.optimizer.param_groups for p in group["params"]}
        foreign = len(owned - {id(p) for p in self.model.parameters()})
        if foreign:
            return f"optimizer must own only the model's parameters; {foreign} of its are not the model's"
        missing = [name for name, p in self.model.named_parameters() if p.requires_grad and id(p) not in owned]
        if missing:
            return (
                f"optimizer must own every trainable parameter of the model; it lacks "
                f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''} ({len(missing)} in all)"
            )
        if not any(p.requires_grad for p in self.model.parameters()):
            return "model has no trainable parameters (every one has requires_grad=False)"
        return None

    def _optimizer_stepping(self, optimizer, args, kwargs):
        """The optimizer's step pre-hook: counts the steps not made by :meth:`step`."""
        if not self._inside_step:
            self._outside_steps += 1

    def _optimizer_step(self):
        """The local optimizer step of :meth:`_step`; with the ``scaler``
        given to :meth:`step`, ``scaler.step(optimizer)`` (which unscales the
        gradients unless ``unscale_`` did, and skips the step on inf/NaN)."""
        if self._scaler is None:
            self.optimizer.step()
        else:
            self._scaler.step(self.optimizer)

    def plan(self, total_steps: int, batch_size: int) -> None:
        """Told by the training loop before the first step: the run's number
        of steps and the per-rank batch (the shares' budget is ``size *
        batch_size`` when the algorithm reallocates)."""
        self.total_steps, self.samples_per_step = total_steps, batch_size
        if self.options.get("reallocate"):
            self._policy = Reallocation(self.comm.size, batch_size)

    def step(self, scaler: torch.amp.GradScaler | None = None) -> None:
        """One training step, after ``backward()``: the optimizer step and
        whatever communication the algorithm does at this step.

        Args:
            scaler: a ``torch.amp.GradScaler`` of a mixed-precision loop:
                the optimizer step is ``scaler.step(optimizer)`` (call
                ``scaler.update()`` after this).

        Raises:
            RuntimeError: ``optimizer.step()`` was called since the last
                step outside it (before any communication of this step).

        Also times the rank's work for the reallocation: the seconds from
        the end of the previous call to the start of this one (data,
        forward, backward, injected delays; not the communication inside
        :meth:`step`) and the samples of the step.  A step whose start was
        not seen (the first, without :meth:`start_step_timer`) counts
        neither its seconds nor its samples."""
        entered = time.perf_counter()
        if self._outside_steps:
            count, self._outside_steps = self._outside_steps, 0
            raise RuntimeError(
                f"{self.name}: optimizer.step() was called {count} time(s) since the last algo.step(), "
                f"outside it: call algo.step() in its place (it runs the optimizer step and {self.name}'s "
                f"communication); the replicas have not been averaged as {self.name} averages them"
            )
        if self._returned is not None:
            self._period_seconds += entered - self._returned
            self._period_samples += self.samples_per_step or 0
        if self._survivable:
            with self.lock:
                self._before_step = (
                    [p.detach().clone() for p in self.model.parameters()],
                    copy.deepcopy(self.optimizer.state_dict()),
                )
        self._scaler, self._inside_step = scaler, True
        try:
            self._step()
        finally:
            self._scaler, self._inside_step = None, False
        self._before_step = None
        self.steps += 1
        self.comm_in_backward_s, self._comm_in_backward = self._comm_in_backward, 0.0
        self._returned = time.perf_counter()

    def start_step_timer(self) -> None:
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
        """With ``sync="stragglar"``: the :class:`~collectives.stragglar.training_sync.
        PredictedStragglerSync` of the global averages over ``templates``
        (averaging, op ``avg``), kept in :attr:`straggler_sync`."""
        if sync == "stragglar":
            self.straggler_sync = PredictedStragglerSync(self.comm, templates, op="avg")
        return self.straggler_sync

    def _open_outer(self, lr: float, momentum: float, nesterov: bool) -> OuterOptimizer:
        """The :class:`~wagma.outer.OuterOptimizer` of the whole model's flat
        buffers, kept in :attr:`outer`."""
        self.outer = OuterOptimizer(list(self.flat.params.values()), lr=lr, momentum=momentum, nesterov=nesterov)
        return self.outer

    def outer_optimizers(self) -> list[OuterOptimizer]:
        """The algorithm's outer optimizers: :attr:`outer` where there is
        one (Streaming DiLoCo: one per fragment)."""
        return [self.outer] if self.outer is not None else []

    def _average_globally(self, tensors: list[torch.Tensor], stream: str = "global") -> None:
        """The ranks' average of ``tensors``, in place: StragglAR with the
        predicted straggler under ``sync="stragglar"``, else the allreduce
        (one per tensor), compressed under ``compression`` (``stream``
        names what is averaged, whose residuals are its own)."""
        if self.straggler_sync is not None:
            compressors = [self._compressor((stream, i), t) for i, t in enumerate(tensors)]
            self.straggler_sync(tensors, compressors=compressors)
            self._count_allreduces(self.comm.size, [t for t, c in zip(tensors, compressors) if c is None])
        else:
            for i, tensor in enumerate(tensors):
                self._average_over(tensor, self.comm, (stream, i))

    def _compressor(self, key: tuple[Any, ...], tensor: torch.Tensor) -> Compressor | None:
        """The compressed stream ``key`` of ``tensor``'s size (made at its
        first use), or None without compression."""
        if self.compression == "none":
            return None
        compressor = self._compressors.get(key)
        if compressor is None:
            compressor = compressor_for(self.compression, tensor.numel())
            assert compressor is not None  # compression is not "none"
            self._compressors[key] = compressor
        return compressor

    def _average_over(self, tensor: torch.Tensor, comm: Communicator, key: tuple[Any, ...]) -> None:
        """The average of ``tensor`` over ``comm``, in place: the allreduce,
        or under ``compression`` the compressed one of stream ``key``."""
        compressor = self._compressor(key, tensor)
        if compressor is None:
            allreduce(tensor, comm=comm, op="avg")
            self._count_allreduces(comm.size, [tensor])
        else:
            compressed_allreduce(tensor, comm=comm, compressor=compressor, op="avg")

    def _count_allreduces(self, ranks: int, tensors: list[torch.Tensor]) -> None:
        """Add uncompressed allreduces of ``tensors`` over ``ranks`` ranks to
        :attr:`bytes_sent`, as a bandwidth-optimal allreduce sends them."""
        self._bytes_counted += sum(allreduce_bytes(ranks, t.numel() * t.element_size()) for t in tensors)

    def _keep_bytes_of(self, collectives: Mapping[Any, Any] | None) -> None:
        """Before wait-avoiding ``collectives`` are closed or abandoned: the
        bytes their streams sent stay in :attr:`bytes_sent`."""
        self._bytes_counted += sum(c.bytes_sent for c in held_compressors(collectives))

    def compressors(self) -> list[Compressor]:
        """Every compressed stream of the algorithm (its own; subclasses add
        those of the collectives they hold)."""
        return list(self._compressors.values())

    @property
    def bytes_sent(self) -> float:
        """The bytes this rank has sent to average so far, the compressed
        streams' encoded bytes as they went to MPI, and each uncompressed
        allreduce over n ranks of b bytes as 2 (n - 1) / n b, what a
        bandwidth-optimal allreduce (ring, Rabenseifner) sends; point-to-point
        exchanges (neighbours, gossip, EnsembleSync's tree) as they are sent."""
        return self._bytes_counted + sum(c.bytes_sent for c in self.compressors())

    def _outer_step(self) -> None:
        """A global synchronization through :attr:`outer`: the ranks average
        their pseudo-gradients and every model becomes the outer step's theta^(t)."""
        assert self.outer is not None
        self.outer.step(list(self.flat.params.values()), self._average_globally)

    def sync_tables(self) -> dict[str, tuple[np.ndarray, list[str]]]:
        """Tables for the run file's ``sync/`` group, ``name -> (rows,
        columns)``: the straggler predictor's log with ``sync="stragglar"``
        (one row per global synchronization)."""
        if self.straggler_sync is None:
            return {}
        return {"stragglers": (self.straggler_sync.rows(), list(self.straggler_sync.COLUMNS))}

    @property
    def dead_ranks(self) -> set[int]:
        """The ranks that left the job (ULFM, :attr:`membership`), as ranks
        of the communicator the algorithm was first built on; the run file
        lists them."""
        return set(self.membership.left)

    def deaths_without_shrink(self) -> list[dict[str, Any]]:
        """On the run file's root: members found dead that the others went on
        without, with no shrink (ensemble_sync's coordinator), one dict per
        rank: ``rank`` (of the first communicator), ``step`` (the first step
        the others ran without it), ``waited_s`` (how long they waited for it)
        and ``timed_out`` (whether that wait was the timeout, else MPI named
        it dead at once); none here: a dead rank is a membership change
        (:func:`wagma.membership.survive`)."""
        return []

    def expect_replacements(self, wanted: bool) -> None:
        """Whether the caller replaces dead members (:func:`wagma.healing.replace`)
        from now on; nothing to do here, where a dead member leaves by a
        shrink that every survivor sees (ensemble_sync's coordinator then
        makes a round after a death wait for every living rank:
        ``dead_to_replace``)."""

    def run_attributes(self) -> dict[str, Any]:
        """Root attributes of the run file this algorithm adds at the end,
        on rank 0 (ensemble_sync: the outages its rounds show); none here."""
        return {}

    def _step(self):
        raise NotImplementedError

    def abandon(self) -> None:
        """After a failure (:func:`wagma.membership.survive`), without
        communicating: stop the algorithm's threads, let go of what it holds
        on the old members, and put back the model and optimizer state of
        the start of a step that failed half-way.  Subclasses that run
        threads or hold collectives stop them first, then call this."""
        self._step_hook.remove()
        hold(self.straggler_sync)  # its communicators are revoked, a reduction may be in flight on them
        self.straggler_sync = None  # a new one is built with the algorithm
        if self._before_step is not None:
            parameters, optimizer_state = self._before_step
            with torch.no_grad(), self.lock:
                for p, saved in zip(self.model.parameters(), parameters):
                    p.copy_(saved)
            self.optimizer.load_state_dict(optimizer_state)
            self._before_step = None

    def rebuild(self, comm: Communicator, options: Mapping[str, Any], step: int, source: int) -> None:
        """Build the algorithm again on the survivors ``comm`` after
        :meth:`abandon` (collective over them; :func:`wagma.membership.survive`
        calls it): with ``options`` (fitted to the rank count), going on from
        ``step``; under :attr:`survivors_continue_from` ``"source"`` every
        member takes the model, buffers and optimizer state of member
        ``source``.  The membership, the stale count, the plan and the work
        measured so far are kept; the algorithm owns ``comm`` from now on
        (:meth:`close` closes it)."""
        kept = {
            name: getattr(self, name)
            for name in (
                "membership",
                "stale_steps",
                "work_measured",
                "_period_samples",
                "_period_seconds",
                "_returned",
                "_compressors",
                "_bytes_counted",
            )
        }
        total, batch = self.total_steps, self.samples_per_step
        outer = [o.state_dict() for o in self.outer_optimizers()]
        type(self).__init__(self, self.model, self.optimizer, comm, init_sync=False, **options)
        if outer:
            # The anchors and the momenta are the same on every member, unless the failure
            # cut an outer step short on some: the source's are every member's from now on.
            states = comm.control.bcast(outer if comm.rank == source else None, root=source)
            for optimizer, state in zip(self.outer_optimizers(), states):
                optimizer.load_state_dict(state)
        for name, value in kept.items():
            setattr(self, name, value)
        self.own_communicator(comm)
        self.adopt_source(source)
        if total is not None and batch is not None:
            self.plan(total, batch)
        self.steps = step

    def own_communicator(self, comm: Communicator) -> None:
        """The algorithm owns ``comm`` from now on: :meth:`close` closes it
        (the communicator of a membership change, which no caller holds)."""
        self._owned_comm = comm

    def adopt_source(self, source: int) -> None:
        """Under :attr:`survivors_continue_from` ``"source"``, every member
        takes the model, buffers and optimizer state of member ``source``
        (a broadcast, collective); the others keep their own."""
        if self.survivors_continue_from != "source":
            return
        comm = self.comm
        state = comm.control.bcast(
            {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}
            if comm.rank == source
            else None,
            root=source,
        )
        if comm.rank != source:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])

    def close(self) -> None:
        """Release threads and communicators the algorithm holds (collective)."""
        self._step_hook.remove()
        if self.straggler_sync is not None:
            self.straggler_sync.close()
            self.straggler_sync = None
        if self._owned_comm is not None:
            self._owned_comm.close()
            self._owned_comm = None

    def __enter__(self) -> "Self":
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    def zero_grad(self) -> None:
        """Zero the gradients, keeping them views of the flat buffer (one
        write per dtype).  ``optimizer.zero_grad()`` works too: the
        gradients it sets to None are copied back into the flat buffer
        where the algorithm needs them, at the cost of that copy."""
        self.flat.zero_grad()

    def state_dict(self) -> dict[str, Any]:
        """The algorithm's counters and options (not the model or optimizer),
        the outer optimizers' states where there are any (``outer``: each
        one's anchor and momentum buffer), and the error feedback's residuals
        of the compressed streams it holds (``residuals``; those of the
        wait-avoiding collectives' streams are not kept)."""
        state = {"algorithm": self.name, "steps": self.steps, "options": dict(self.options)}
        if self.outer_optimizers():
            state["outer"] = [o.state_dict() for o in self.outer_optimizers()]
        residuals = {
            key: (c.residual.copy(), c.owner_residual.copy())
            for key, c in self._compressors.items()
            if c.residual is not None and c.owner_residual is not None
        }
        if residuals:
            state["residuals"] = residuals
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("algorithm") != self.name:
            raise ValueError(f"state_dict is for algorithm {state.get('algorithm')!r}, not {self.name!r}")
        saved = state.get("options", {})
        problem = self.Options.keyword_problem(saved)
        # Options added since the state was saved read as their defaults; options saved on more ranks (a
        # run resumed on the ranks left after ranks died) are fitted to this rank count as survivors fit them.
        if (
            problem is not None
            or self.Options(**saved).fit(self.comm.size)[0].resolve(self.comm.size).as_dict() != self.options
        ):
            raise ValueError(f"state_dict options {saved} differ from this run's {self.options}")
        for optimizer, saved in zip(self.outer_optimizers(), state.get("outer", [])):
            optimizer.load_state_dict(saved)
        for key, (residual, owner) in state.get("residuals", {}).items():
            compressor = compressor_for(self.compression, residual.size)
            assert compressor is not None and compressor.residual is not None and compressor.owner_residual is not None
            compressor.residual[:], compressor.owner_residual[:] = residual, owner
            self._compressors[key] = compressor
        self.steps = int(state["steps"])

    def __repr__(self) -> str:
        options = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
        return f"{type(self).__name__}({options}; step {self.steps}, {self.flat!r})"
