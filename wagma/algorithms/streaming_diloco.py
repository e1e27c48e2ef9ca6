"""Streaming DiLoCo (Douillard et al., 2025): DiLoCo's outer steps by fragments, staggered and overlapped."""

from dataclasses import dataclass
from typing import Any

import torch

from collectives.background import BackgroundAllreduce, PendingAllreduce
from collectives.comm import Communicator

from ..options.algorithms import StreamingDiLoCoOptions
from ..outer import OuterOptimizer
from .base import Algorithm

__all__ = ["StreamingDiLoCo", "fragment_layers", "fragment_offset"]


def _layers(model: torch.nn.Module) -> list[list[torch.nn.Parameter]]:
    """The trainable parameters grouped by the module that owns them (a
    layer: the name up to its last dot), in the model's order (that of
    :class:`~wagma.flat.FlatParameters`: each shared parameter once)."""
    layers: list[list[torch.nn.Parameter]] = []
    owner = None
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        module = name.rpartition(".")[0]
        if not layers or module != owner:
            layers.append([])
            owner = module
        layers[-1].append(p)
    return layers


def fragment_layers(layers: int, fragments: int) -> list[list[int]]:
    """Which layers each fragment holds: fragment p the layers l with
    ``l % fragments == p``, a stride of the model (the paper's strided
    pattern, section 2.2, which it found slightly better than consecutive
    blocks: every fragment then spans the depth of the network)."""
    return [list(range(p, layers, fragments)) for p in range(fragments)]


def fragment_offset(fragment: int, fragments: int, period: int) -> int:
    """o_p = floor(p * H / M): fragment p begins its exchanges after the steps
    t with ``(t + 1) % H == o_p`` (fragment 0 on DiLoCo's schedule), so the
    M fragments' exchanges are spread evenly over the period (section 2.2)."""
    return fragment * period // fragments


@dataclass
class _Exchange:
    """A fragment's exchange in flight: its pseudo-gradients being averaged, and the step after which it lands."""

    fragment: int
    lands_after: int
    pending: "list[PendingAllreduce[torch.Tensor]] | list[_Landed]"


class StreamingDiLoCo(Algorithm):
    """Streaming DiLoCo: DiLoCo's outer step, fragment by fragment, overlapped with the inner steps.

    The model's layers (the trainable parameters grouped by the module that
    owns them) are split into M = ``fragments`` fragments, each a stride of
    the layers (:func:`fragment_layers`).  Each fragment p is DiLoCo
    (:class:`~wagma.algorithms.diloco.DiLoCo`) on its own schedule, with its
    own outer optimizer (:class:`~wagma.outer.OuterOptimizer`: its anchor,
    the fragment's global value of its last outer step, and its momentum):

    * after step t with ``(t + 1) % H == o_p`` (:func:`fragment_offset`,
      so the fragments take turns, H / M steps apart), the fragment's
      pseudo-gradient Delta_p = anchor_p - theta_p(t) is taken and its
      average over the ranks starts, on a worker thread
      (:class:`~collectives.background.BackgroundAllreduce`), while the
      inner steps go on;
    * after step t + tau (tau = ``overlap_steps``), the average is waited
      for and the outer step applied: theta~_p = OuterOpt(anchor_p, Delta),
      the new anchor; the fragment's local parameters, which trained on for
      tau steps, become ``alpha * local + (1 - alpha) * theta~_p``
      (``torch.lerp``; alpha = ``mixing``).  With tau = 0 the exchange
      blocks and the fragment becomes theta~_p, as in DiLoCo.

    So with one fragment and tau = 0 this is DiLoCo (tested bitwise).  The
    paper's reading taken where it leaves a choice: alpha = 0.5 is the
    paper's (section 2.3); torchft's ``fragment_update_alpha`` defaults to 0,
    which drops the tau steps' local progress of the fragment.  The
    fragments' layers are the parameters' owning modules, in model order,
    the paper's "blocks" for a model of any kind; ``fragments`` must not
    exceed them (checked before any communication).

    Communication per H steps: one average of each fragment, about 1 / M of
    the model each, in place of DiLoCo's one of the whole model: the same
    bytes, a peak M times lower, and hidden behind tau steps of compute.

    State, as DiLoCo's: the inner optimizer's own per rank; the anchors and
    momenta, the same on every rank, in
    :meth:`~wagma.algorithms.base.Algorithm.state_dict` (which first lands
    the exchanges in flight, so a resumed run applies them at the same
    steps).  An exchange in flight when a rank dies is dropped, not
    applied: the fragment's next pseudo-gradient is taken against the same
    anchor, so the inner progress is carried by it, and only one outer step
    of the fragment is lost.

    Between ``backward()`` and :meth:`~wagma.algorithms.base.Algorithm.step`
    the gradients are this rank's own.  Buffers stay local.

    Options (:class:`~wagma.options.algorithms.StreamingDiLoCoOptions`):
    ``period`` (H), ``fragments`` (M), ``overlap_steps`` (tau), ``mixing``
    (alpha), ``outer_lr``, ``outer_momentum``, ``outer_nesterov``.
    """

    name = "streaming_diloco"
    Options = StreamingDiLoCoOptions
    config: StreamingDiLoCoOptions

    def __init__(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, comm: Communicator, **options: Any
    ) -> None:
        self._fragments_asked = options.get("fragments", StreamingDiLoCoOptions().fragments)
        super().__init__(model, optimizer, comm, **options)
        c = self.config
        self.period, self.overlap_steps, self.mixing = c.period, c.overlap_steps, c.mixing
        layers = _layers(model)
        #: Each fragment's parameters, by dtype, in model order.
        self.fragments: list[dict[torch.dtype, list[torch.nn.Parameter]]] = []
        for held in fragment_layers(len(layers), c.fragments):
            by_dtype: dict[torch.dtype, list[torch.nn.Parameter]] = {}
            for layer in held:
                for p in layers[layer]:
                    by_dtype.setdefault(p.dtype, []).append(p)
            self.fragments.append(by_dtype)
        #: Each fragment's outer optimizer, over its parameters of each dtype as one tensor.
        self.outers = [
            OuterOptimizer(self._values(f), lr=c.outer_lr, momentum=c.outer_momentum, nesterov=c.outer_nesterov)
            for f in range(c.fragments)
        ]
        self._offsets = [fragment_offset(f, c.fragments, c.period) for f in range(c.fragments)]
        self._in_flight: list[_Exchange] = []
        self._background = BackgroundAllreduce(comm.data, op="avg").open()

    def _check_model_and_optimizer(self):
        problem = super()._check_model_and_optimizer()
        if problem is None and isinstance(self._fragments_asked, int):
            layers = len(_layers(self.model))
            if self._fragments_asked > layers:
                problem = (
                    f"fragments must be at most the model's {layers} layers (modules that own trainable "
                    f"parameters), got {self._fragments_asked}"
                )
        return problem

    def _values(self, fragment: int) -> list[torch.Tensor]:
        """The fragment's parameters of each dtype, concatenated (a copy)."""
        return [torch.cat([p.detach().reshape(-1) for p in ps]) for ps in self.fragments[fragment].values()]

    def _step(self):
        t = self.steps
        self._optimizer_step()
        while self._in_flight and self._in_flight[0].lands_after == t:
            self._land(self._in_flight.pop(0))
        for f, offset in enumerate(self._offsets):
            if (t + 1) % self.period == offset:
                self._begin(f, t)

    def _begin(self, fragment: int, t: int) -> None:
        deltas = self.outers[fragment].pseudo_gradients(self._values(fragment))
        pending = []
        for k, delta in enumerate(deltas):
            compressor = self._compressor(("fragment", fragment, k), delta)
            if compressor is None:
                self._count_allreduces(self.comm.size, [delta])
            pending.append(self._background.submit(delta, compressor))
        exchange = _Exchange(fragment, t + self.overlap_steps, pending)
        if self.overlap_steps == 0:
            self._land(exchange)
        else:
            self._in_flight.append(exchange)

    def _land(self, exchange: _Exchange) -> None:
        """Wait for the exchange's average, take the fragment's outer step and
        merge its result into the local parameters."""
        outer = self.outers[exchange.fragment]
        averaged = [pending.wait() for pending in exchange.pending]
        weight = 1.0 - self.mixing
        with torch.no_grad():
            for params, updated in zip(self.fragments[exchange.fragment].values(), outer.apply(averaged)):
                offset = 0
                for p in params:
                    value = updated[offset : offset + p.numel()].view(p.shape)
                    offset += p.numel()
                    if self.overlap_steps == 0:
                        p.copy_(value)
                    else:
                        p.lerp_(value, weight)

    def outer_optimizers(self) -> list[OuterOptimizer]:
        """One outer optimizer per fragment."""
        return list(self.outers)

    def state_dict(self) -> dict[str, Any]:
        """The counters and options, each fragment's outer state
        (``outer``), and the exchanges in flight with their averages, waited
        for (``in_flight``; collective: every rank saves at the same step)."""
        state = super().state_dict()
        state["in_flight"] = [
            {"fragment": e.fragment, "lands_after": e.lands_after, "averaged": [p.wait().clone() for p in e.pending]}
            for e in self._in_flight
        ]
        return state

    def load_state_dict(self, state: Any) -> None:
        super().load_state_dict(state)
        self._in_flight = [
            _Exchange(e["fragment"], e["lands_after"], [_Landed(a) for a in e["averaged"]]) for e in state["in_flight"]
        ]

    def abandon(self) -> None:
        """Stop the worker thread without communicating (a dead rank); the
        exchanges in flight are dropped."""
        self._background.abandon()
        self._in_flight = []
        super().abandon()

    def close(self) -> None:
        """Wait for the exchanges in flight (not applied: the run is over) and stop the worker (collective)."""
        for exchange in self._in_flight:
            for pending in exchange.pending:
                pending.wait()
        self._in_flight = []
        self._background.close()
        super().close()


class _Landed:
    """An exchange's average that a checkpoint carried: already there."""

    def __init__(self, averaged: torch.Tensor) -> None:
        self.averaged = averaged

    def wait(self) -> torch.Tensor:
        return self.averaged
