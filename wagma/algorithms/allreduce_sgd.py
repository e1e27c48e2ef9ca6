"""Allreduce-SGD done like DDP: bucketed gradient averaging overlapped with the backward pass."""

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import torch

from collectives import broadcast
from collectives.background import BackgroundAllreduce
from collectives.comm import Communicator

from ..options.algorithms import AllreduceSGDOptions
from .base import Algorithm

__all__ = ["AllreduceSGD"]


class AllreduceSGD(Algorithm):
    """Synchronous data-parallel SGD: gradients averaged over all ranks every step.

    Done the way PyTorch DDP does it (Li et al., VLDB 2020, sections 3.2.2
    to 3.2.4): the flat gradient buffer is cut into buckets of about
    ``bucket_cap_mb`` MB, consecutive parameters in reverse order (the order
    in which backward produces their gradients), one dtype per bucket.  A
    hook after each gradient's accumulation counts down its bucket; a bucket
    whose gradients are all there is launched, in bucket order (so that
    every rank reduces the same buckets in the same sequence), as a
    nonblocking allreduce (average) on a worker thread, overlapping the rest
    of the backward pass.

    **The gradient contract (DDP's).**  When ``backward()`` returns, every
    gradient is the global average: the first hook of a backward pass
    queues a callback that the autograd engine runs at the end of the pass
    (DDP's ``queue_callback``), and it launches the buckets whose gradients
    never came (parameters unused in this pass: their gradient counts as
    zero) and waits for every bucket.  So gradient clipping
    (``clip_grad_norm_`` clips the global gradient, to the same norm on
    every rank), ``GradScaler.unscale_``, inspecting gradients and gradient
    hooks between ``backward()`` and :meth:`~wagma.algorithms.base.Algorithm.step` see the global average,
    and the replicas take the same step.  Accumulating over several
    backward passes without :meth:`no_sync` averages at each pass, adding
    the average of each pass's local gradients to the average already
    there: the result is the average of the sums, as with :meth:`no_sync`,
    up to float rounding, and the same from run to run.  Inside
    :meth:`no_sync` backward accumulates the local gradients without
    communication (the gradients are local until a backward pass outside
    it averages the sum); a :meth:`~wagma.algorithms.base.Algorithm.step` that follows only passes inside
    :meth:`no_sync`, or no backward pass at all (gradients set by hand,
    emulated compute), averages the gradients itself, before the optimizer
    step, so the replicas stay equal.

    ``optimizer.zero_grad()`` works as well as :meth:`~wagma.algorithms.base.Algorithm.zero_grad`: a
    gradient it set to None is copied into its bucket by its hook.

    Buffers (BatchNorm statistics) are broadcast from rank 0 after every
    step, as DDP does (``broadcast_buffers=True``).

    With ``sync="stragglar"``, a synchronization for which the predictor
    (:mod:`collectives.stragglar.training_sync`) names a rank that will arrive last
    launches no bucket during backward: the end-of-backward callback
    averages each dtype's whole gradient with StragglAR, that rank as the
    straggler.  The overlap of buckets with backward and StragglAR's
    overlap of the others' ReduceScatter with the straggler's lateness
    hide different things; which is worth more is what the benchmark
    measures.  Synchronizations without a prediction are DDP's.  Either
    way the average is the same up to the order of the float additions.

    Example::

        algo = create("allreduce_sgd", model, optimizer, comm, bucket_cap_mb=25)
        for micro_batches in loader:
            algo.zero_grad()
            with algo.no_sync():
                for x, y in micro_batches[:-1]:
                    loss_fn(model(x), y).backward()
            loss_fn(model(micro_batches[-1][0]), micro_batches[-1][1]).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)   # the global gradient
            algo.step()
        algo.close()
    """

    name = "allreduce_sgd"
    Options = AllreduceSGDOptions
    #: Gradient averaging keeps the replicas equal, so the survivors of a dead rank take the
    #: most advanced survivor's model and optimizer state (:func:`wagma.membership.survive`).
    survivors_continue_from = "source"
    config: AllreduceSGDOptions

    def __init__(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, comm: Communicator, **options: Any
    ) -> None:
        super().__init__(model, optimizer, comm, **options)
        assert self.flat.grads is not None  # FlatParameters keeps gradients unless told not to
        self._open_straggler_sync(self.config.sync, self.flat.grads.values())
        self.buckets = self._make_buckets(int(self.config.bucket_cap_mb * 1e6))
        self._bucket_of = {id(p): b for b, (_, _, _, params) in enumerate(self.buckets) for p in params}
        self._grad_view = {
            id(p): self.flat._view(self.flat.grads, p, dtype, offset) for p, dtype, offset in self.flat._slices
        }
        self._background = BackgroundAllreduce(comm.data, op="avg").open()
        self._sync = True
        self._callback_queued = False
        self._local = False  # gradients accumulated in no_sync() and not averaged since
        self._averaged = False  # whether a backward pass averaged the gradients since the last step
        self._reset()
        self._hooks = [p.register_post_accumulate_grad_hook(self._gradient_ready) for p in self.flat.parameters]

    def _make_buckets(self, cap_bytes):
        """``(dtype, lo, hi, parameters)`` slices of the flat gradients."""
        buckets = []
        for p, dtype, offset in reversed(self.flat._slices):
            if buckets and buckets[-1][0] == dtype and ((buckets[-1][2] - offset) * p.element_size() <= cap_bytes):
                _, _, hi, params = buckets[-1]
                buckets[-1] = (dtype, offset, hi, params + [p])
            else:
                buckets.append((dtype, offset, offset + p.numel(), [p]))
        return buckets

    def _reset(self):
        self._waiting = [len(params) for *_, params in self.buckets]
        self._launched = []

    def _stragglar_sync(self):
        """Whether this synchronization goes to StragglAR (a predicted straggler)."""
        return self.straggler_sync is not None and self.straggler_sync.straggler is not None

    def _gradient_ready(self, p):
        """Post-accumulate hook: keep ``p.grad`` the bucket's view, count
        down its bucket, launch the buckets that are complete, in order."""
        view = self._grad_view[id(p)]
        if p.grad is not view and (p.grad.data_ptr() != view.data_ptr() or p.grad.shape != view.shape):
            with torch.no_grad():
                view.copy_(p.grad)  # a fresh gradient, after optimizer.zero_grad()
            p.grad = view
        if not self._sync:
            self._local = True
            return
        if not self._callback_queued:
            self._callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_done)
        if self._stragglar_sync():
            return
        self._waiting[self._bucket_of[id(p)]] -= 1
        while len(self._launched) < len(self.buckets) and self._waiting[len(self._launched)] == 0:
            self._launch(len(self._launched))

    def _launch(self, b):
        if not self._launched:
            self._first_launch = time.perf_counter()
        dtype, lo, hi, _ = self.buckets[b]
        bucket = self.flat.grads[dtype][lo:hi]
        compressor = self._compressor(("bucket", b), bucket)
        if compressor is None:
            self._count_allreduces(self.comm.size, [bucket])
        self._launched.append(self._background.submit(bucket, compressor))

    def _backward_done(self):
        """Run by autograd at the end of a backward pass outside
        :meth:`no_sync`: the gradients become the global average (its
        seconds count in :attr:`comm_in_backward_s`)."""
        self._callback_queued = False
        entered = time.perf_counter()
        self._average()
        self._comm_in_backward += time.perf_counter() - entered

    def _average(self):
        """Average the whole flat gradient over all ranks: the buckets not
        launched yet, then wait for all (or StragglAR with a predicted
        straggler)."""
        self.flat.attach_grads()  # unused parameters' None gradients count as zeros
        sync = self.straggler_sync
        if sync is not None:
            sync.begin(reduction_started=self._first_launch if self._launched else None)
        if self._stragglar_sync():
            for dtype, grads in self.flat.grads.items():
                compressor = self._compressor(("stragglar", dtype), grads)
                sync.reduce(grads, compressor)
                if compressor is None:
                    self._count_allreduces(self.comm.size, [grads])
        else:
            while len(self._launched) < len(self.buckets):
                self._launch(len(self._launched))
            for pending in self._launched:
                pending.wait()
        if sync is not None:
            sync.end()
        self._reset()
        self._local = False
        self._averaged = True

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside accumulate the local gradients without communication."""
        self._sync = False
        try:
            yield
        finally:
            self._sync = True

    def _step(self):
        self.flat.check_views()
        # no_sync() passes since the last average, or no backward pass at all (gradients set by
        # hand, or the zeros of emulated compute): the gradients are averaged here.
        if self._local or not self._averaged:
            self._average()
        self._optimizer_step()
        self._averaged = False
        for tensor in self.flat.buffers.values():
            broadcast(tensor, comm=self.comm, root=0, check=False)

    def abandon(self) -> None:
        """Remove the hooks and stop the worker thread without communicating
        (a dead rank); the gradients of the failed step are dropped."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        self._background.abandon()
        super().abandon()

    def close(self) -> None:
        """Remove the hooks and stop the worker thread (collective)."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        self._background.close()
        super().close()
