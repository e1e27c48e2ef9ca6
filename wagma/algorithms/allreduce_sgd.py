"""Allreduce-SGD done like DDP: bucketed gradient averaging overlapped with the backward pass."""

import contextlib
import time

from collectives import broadcast
from collectives.background import BackgroundAllreduce

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
    of the backward pass.  :meth:`step` launches any bucket whose gradients
    never came (unused parameters: zeros), waits for all of them, then runs
    the optimizer.  Inside :meth:`no_sync` backward accumulates gradients
    without communication; the next backward outside it averages the sum.

    Parameters and buffers are broadcast from rank 0 at construction, and
    buffers (BatchNorm statistics) again after every step, as DDP does
    (``broadcast_buffers=True``).

    Args:
        bucket_cap_mb: bucket size in MB (10**6 bytes), DDP's default 25.
        sync: ``"allreduce"`` or ``"stragglar"``.  With ``"stragglar"``, a
            step for which the predictor (:mod:`collectives.straggler_sync`)
            names a rank that will arrive last launches no bucket during
            backward: :meth:`step` averages each dtype's whole gradient with
            StragglAR, that rank as the straggler.  The overlap of buckets
            with backward and StragglAR's overlap of the others'
            ReduceScatter with the straggler's lateness hide different
            things; which is worth more is what the benchmark measures.
            Steps without a prediction are DDP's, as with ``"allreduce"``.
            Either way the average is the same up to the order of the float
            additions.

    Example::

        algo = create("allreduce_sgd", model, optimizer, comm, bucket_cap_mb=25)
        for micro_batches in loader:
            algo.zero_grad()
            with algo.no_sync():
                for x, y in micro_batches[:-1]:
                    loss_fn(model(x), y).backward()
            loss_fn(model(micro_batches[-1][0]), micro_batches[-1][1]).backward()
            algo.step()
        algo.close()
    """

    name = "allreduce_sgd"

    def __init__(self, model, optimizer, comm, *, bucket_cap_mb=25.0, sync="allreduce"):
        super().__init__(model, optimizer, comm, bucket_cap_mb=bucket_cap_mb, sync=sync)
        self._broadcast_from_root()
        self._open_straggler_sync(sync, self.flat.grads.values())
        self.buckets = self._make_buckets(int(bucket_cap_mb * 1e6))
        self._bucket_of = {id(p): b for b, (_, _, _, params) in enumerate(self.buckets)
                           for p in params}
        self._background = BackgroundAllreduce(comm.data, op="avg").open()
        self._sync = True
        self._reset()
        self._hooks = [p.register_post_accumulate_grad_hook(self._gradient_ready)
                       for p in self.flat.parameters]

    @classmethod
    def check_options(cls, world_size, *, bucket_cap_mb, sync):
        if isinstance(bucket_cap_mb, bool) or not isinstance(bucket_cap_mb, (int, float)) \
                or not bucket_cap_mb > 0:
            return f"bucket_cap_mb must be a number > 0, got {bucket_cap_mb!r}"
        return cls._sync_problem(sync)

    def _make_buckets(self, cap_bytes):
        """``(dtype, lo, hi, parameters)`` slices of the flat gradients."""
        buckets = []
        for p, dtype, offset in reversed(self.flat._slices):
            if buckets and buckets[-1][0] == dtype and (
                    (buckets[-1][2] - offset) * p.element_size() <= cap_bytes):
                _, _, hi, params = buckets[-1]
                buckets[-1] = (dtype, offset, hi, params + [p])
            else:
                buckets.append((dtype, offset, offset + p.numel(), [p]))
        return buckets

    def _reset(self):
        self._waiting = [len(params) for *_, params in self.buckets]
        self._launched = []

    def _stragglar_step(self):
        """Whether this step's gradients go to StragglAR (a predicted straggler)."""
        return self.straggler_sync is not None and self.straggler_sync.straggler is not None

    def _gradient_ready(self, p):
        if not self._sync or self._stragglar_step():
            return
        b = self._bucket_of[id(p)]
        self._waiting[b] -= 1
        while len(self._launched) < len(self.buckets) and \
                self._waiting[len(self._launched)] == 0:
            self._launch(len(self._launched))

    def _launch(self, b):
        if not self._launched:
            self._first_launch = time.perf_counter()
        dtype, lo, hi, _ = self.buckets[b]
        self._launched.append(self._background.submit(self.flat.grads[dtype][lo:hi]))

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside accumulate gradients without communication."""
        self._sync = False
        try:
            yield
        finally:
            self._sync = True

    def _step(self):
        self.flat.check_views()
        sync = self.straggler_sync
        if sync is not None:
            sync.begin(reduction_started=self._first_launch if self._launched else None)
        if self._stragglar_step():
            for grads in self.flat.grads.values():
                sync.reduce(grads)
        else:
            while len(self._launched) < len(self.buckets):
                self._launch(len(self._launched))
            for pending in self._launched:
                pending.wait()
        if sync is not None:
            sync.end()
        self.optimizer.step()
        for tensor in self.flat.buffers.values():
            broadcast(tensor, comm=self.comm, root=0, check=False)
        self._reset()

    def close(self):
        """Remove the hooks and stop the worker thread (collective)."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        self._background.close()
        super().close()
