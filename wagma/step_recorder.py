"""Recording a training loop of one's own into the run-file format that ``wagma.analysis`` compares."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

import torch

from collectives.provenance import run_attributes

from .clock import TrainingClock
from .results import RunRecorder

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self is Python 3.11's

    from .algorithms import Algorithm

__all__ = ["StepRecorder"]


class StepRecorder:
    """Every step of a user's own training loop, timed and written to one run file.

    The same file ``experiments.train`` writes (:mod:`wagma.results`:
    ``[rank, step]`` step, compute, communication and wait times, loss,
    stale flag, the training clock, samples; evaluations; the algorithm
    and its options as attributes), so ``python -m wagma.analysis`` and
    :func:`~wagma.results.reader.load_run` read it beside the CLI's runs.  Every
    rank logs each row at once and rank 0 writes them into the file, no
    rank waiting for another (:class:`~wagma.results.recorder.RunRecorder`).  A run that
    raises keeps what it measured: :meth:`abandon` (or leaving the
    ``with`` block by an exception) marks the partial file ``failed``.

    Per step, the loop calls :meth:`start_step` where the step's work
    begins (data, forward), :meth:`compute_done` after ``backward()``, and
    :meth:`end_step` after ``algo.step()``.  The times follow the
    framework's definitions: compute is start to compute_done; comm_time
    is compute_done to the end of ``algo.step()`` (with the communication
    the algorithm did inside ``backward()``,
    :attr:`~wagma.algorithms.base.Algorithm.comm_in_backward_s`, moved from
    compute to it); wait_time is comm_time
    less the optimizer's own step (timed by its step hooks); the clock is
    a :class:`~wagma.clock.TrainingClock`, paused by :meth:`pause` around
    evaluations.  Collective: construction (after one barrier, so every
    rank's clock starts together) and :meth:`close`.

    Args:
        algo: the :class:`~wagma.algorithms.base.Algorithm` the loop drives.
        path: the run file (``.h5``; ``PATH.partial.h5`` until it is complete).
        batch_size: this rank's samples per step.
        steps_planned: the run's steps, if known (the analysis shows progress).
        steps_per_epoch: steps per epoch, if the loop has epochs.
        config: the loop's own settings (learning rate, ...), stored as JSON.
        model, dataset, imbalance: names for the table's columns.
        resume_step: a resumed loop's first step: the partial file of the
            interrupted run goes on from there (:class:`~wagma.results.recorder.RunRecorder`).

    Example::

        with StepRecorder(algo, "runs/mine.h5", batch_size=32, config={"lr": 0.1}) as recorder:
            for step, (x, y) in enumerate(loader):
                recorder.start_step()
                algo.zero_grad()
                loss = loss_fn(model(x), y)
                loss.backward()
                recorder.compute_done()
                algo.step()
                recorder.end_step(step, loss.item())
    """

    def __init__(
        self,
        algo: Algorithm,
        path: str,
        *,
        batch_size: int,
        steps_planned: int = 0,
        steps_per_epoch: int = 0,
        config: Mapping[str, Any] | None = None,
        model: str = "custom",
        dataset: str = "custom",
        imbalance: str = "none",
        resume_step: int | None = None,
    ) -> None:
        self.algo = algo
        world = algo.comm.control
        options = algo.options
        attrs = {
            **run_attributes(world),
            "kind": "measured",
            "algorithm": algo.name,
            "config": json.dumps({**(config or {}), "algorithm_options": options}, default=str),
            "group_size": options.get("group_size", 0),
            "tau": options.get("tau", options.get("period", 0)),
            "imbalance": imbalance,
            "compute": "real",
            "compute_ms": 0.0,
            "model": model,
            "dataset": dataset,
            "parameters": sum(p.numel() for p in algo.model.parameters()),
            "batch_size": batch_size,
            "seed": int((config or {}).get("seed", 0)),
            "steps_planned": steps_planned,
            "steps_per_epoch": steps_per_epoch,
            "torch_version": torch.__version__,
        }
        self.batch_size, self.steps_per_epoch = batch_size, steps_per_epoch
        self._recorder = RunRecorder(world, path, attrs, resume_step=resume_step)
        self._update_s, self._entered = 0.0, 0.0
        self._hooks = [
            algo.optimizer.register_step_pre_hook(self._optimizer_entered),
            algo.optimizer.register_step_post_hook(self._optimizer_left),
        ]
        world.Barrier()
        self.clock = TrainingClock()
        self._last = self._started = self._computed = self.clock()
        self._stale_before, self._delay = algo.stale_steps, 0.0
        self._bytes_before = algo.bytes_sent

    def _optimizer_entered(self, *args: object) -> None:
        self._entered = time.perf_counter()

    def _optimizer_left(self, *args: object) -> None:
        self._update_s += time.perf_counter() - self._entered

    def start_step(self, delay_s: float = 0.0) -> None:
        """The step's work begins; ``delay_s``: seconds of it injected
        (:class:`~wagma.imbalance.Injector`), recorded as the step's delay."""
        self._started, self._delay = self.clock(), delay_s
        self._update_s, self._stale_before = 0.0, self.algo.stale_steps
        self.algo.start_step_timer()

    def compute_done(self) -> None:
        """``backward()`` returned: the rest of the step is ``algo.step()``."""
        self._computed = self.clock()

    def end_step(self, step: int, loss: float, samples: int | None = None) -> None:
        """``algo.step()`` returned: record step ``step`` with its ``loss``."""
        now = self.clock()
        sent = self.algo.bytes_sent  # read once: the algorithm's threads may add to it meanwhile
        in_backward = self.algo.comm_in_backward_s  # Allreduce-SGD's wait at the end of backward
        comm_time = now - self._computed + in_backward
        self._recorder.record(
            step,
            step_time=now - self._last,
            compute_time=self._computed - self._started - in_backward,
            delay=self._delay,
            comm_time=comm_time,
            wait_time=max(0.0, comm_time - self._update_s),
            loss=float(loss),
            stale=float(self.algo.stale_steps > self._stale_before),
            clock=now,
            samples=float(self.batch_size if samples is None else samples),
            skipped=0.0,
            contribution=self.algo.contribution,
            bytes_sent=sent - self._bytes_before,
        )
        self._bytes_before = sent
        self._last = now

    def pause(self) -> None:
        """Stop the clock (an evaluation, a checkpoint); :meth:`resume` goes on."""
        self.clock.pause()

    def resume(self) -> None:
        self.clock.resume()

    def record_eval(self, step: int, accuracy: float, loss: float, epoch: float | None = None) -> None:
        """An evaluation after ``step`` steps, written by rank 0 and stamped
        with its clock; ``epoch`` defaults to ``step / steps_per_epoch``
        (NaN without it)."""
        if epoch is None:
            epoch = step / self.steps_per_epoch if self.steps_per_epoch else float("nan")
        self._recorder.record_eval(step=step, epoch=epoch, clock=self.clock(), accuracy=accuracy, loss=loss)
        self._recorder.flush()

    def close(self, status: str = "complete") -> str | None:
        """Collective: write every rank's remaining rows, the algorithm's tables
        (:meth:`~wagma.algorithms.base.Algorithm.sync_tables`) and the summary;
        returns the path on rank 0.  Close the algorithm first where its
        tables are complete only then (AD-PSGD's exchanges)."""
        for hook in self._hooks:
            hook.remove()
        self._recorder.record_tables(self.algo.sync_tables())
        return self._recorder.close(status)

    def abandon(self) -> None:
        """After an error, without communicating: rank 0 writes what the ranks logged, marked ``failed``."""
        for hook in self._hooks:
            hook.remove()
        self._recorder.abandon("failed")

    def __enter__(self) -> "Self":
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if kind is None:
            self.close()
        else:
            self.abandon()
