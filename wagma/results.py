"""One HDF5 file per training run: what it is, how it is written, how it is read.

Schema (``attrs["schema"] == "wagma-run/1"``):

Root attributes
    ``schema``, ``kind`` (``"measured"``; the simulator writes
    ``"simulated"``), ``status`` (``"running"`` while the run writes,
    ``"stopped"`` when it checkpointed and left to be resumed,
    ``"failed"``, ``"complete"``), ``config`` (the full configuration as
    JSON), ``algorithm``, ``ranks`` (P), ``group_size`` (S; 0 where the
    algorithm has none), ``tau`` (0 where none), ``imbalance`` (the spec),
    ``compute`` (``"real"`` or ``"emulate"``), ``model``, ``dataset``,
    ``parameters`` (count), ``batch_size`` (per rank), ``seed``,
    ``steps_planned`` (per rank), ``steps_per_epoch``, ``resumed_at``
    (steps at which resumed segments began) and the provenance of
    :func:`collectives.bench.provenance.run_attributes` (host names, MPI
    library, git commit, start time...) plus ``torch_version``.

``steps/<field>``: float64 ``[rank, step]``, NaN where nothing arrived
    ``step_time``     seconds from the end of the rank's previous step to the end
                      of this one, on the training clock
    ``compute_time``  forward and backward (or the emulated sleep), including
                      the injected delay
    ``delay``         the injected part of ``compute_time``
    ``comm_time``     seconds in the algorithm's ``step()``: the optimizer update
                      and whatever communication the main thread does or waits for
    ``wait_time``     ``comm_time`` minus the optimizer's update: waiting for
                      peers, transfers not overlapped, the averaging arithmetic
    ``loss``          the training loss of the rank's batch (NaN when emulated)
    ``stale``         1 when the rank's contribution was stale (WAGMA-SGD,
                      eager-SGD: a group version started without it), else 0
    ``clock``         the training clock at the end of the step: seconds since
                      the run's common start, evaluation and checkpoints excluded,
                      continued across resumed segments
    ``samples``       the samples of the rank's batch (``batch_size`` unless the
                      algorithm reallocates work; 0 for a skipped step)
    ``skipped``       1 for a step the rank skipped (ensemble_sync's fast-forward
                      of a rank that came back late: it adopted the others'
                      model at the end of the step instead), else 0; a skipped
                      step's times, loss and stale are NaN and its clock is the
                      rank's clock when it rejoined
    ``contribution``  the iteration of the contribution the rank gave to the
                      step's averaging (:attr:`wagma.algorithms.Algorithm.
                      contribution`: WAGMA-SGD's model, eager-SGD's gradient),
                      what :mod:`wagma.emulate` replays; NaN for the others
    (files written before ``samples``, ``skipped`` and ``contribution``
    existed read as ``batch_size``, 0 and NaN.)  A rank that died has NaN from its death on.
    attribute ``steps.attrs["written"]``: every rank's rows are present for
    steps ``0 .. written - 1``.

``eval/<field>``: one row per evaluation of the averaged model
    ``step``, ``epoch``, ``clock`` (the latest rank's training clock at the end
    of step ``step - 1``: the maximum over ranks of ``steps/clock[:, step - 1]``,
    see :class:`wagma.clock.TrainingClock`),
    ``accuracy``, ``loss``; ``replica_accuracy`` ``[eval, rank]`` when each
    replica is evaluated too (else NaN).

``sync/rounds`` (ensemble_sync): one row per synchronization, as the
    coordinator closed it, columns ``sync/rounds.attrs["columns"]``: round,
    end step, opened and closed (seconds since the coordinator started),
    waited (closed - opened), timed_out, final, then one status per rank
    (1 averaged, 0 rejoined with weight 0, -1 late, -2 dead) and one share
    per rank (its samples per step in the next round).
``sync/stragglers`` (``sync="stragglar"``): one row per global
    synchronization, columns sync, predicted (the straggler StragglAR ran
    with; -1: the allreduce ran, no prediction), last (the rank whose
    arrival was latest), lead_s (the seconds it arrived after the
    second-latest), min_lead_s (the lead a prediction required after it),
    see :mod:`collectives.straggler_sync`; the summary's
    ``stragglar_fraction`` and ``straggler_hit_rate`` come from it (over
    the whole run: the predictor's warm-up included).
``sync/exchanges`` (adpsgd, complete runs): one row per exchange and side,
    in each rank's order: rank, peer, active (1 on the side that asked),
    copied_after and applied_after (the rank's updates done when it copied
    its model and when it added its half difference); what
    :func:`wagma.emulate.logged_schedule` replays.
Root attribute ``dead_ranks``: the ranks that died during the run (JSON list);
    ``fault_events`` (ensemble_sync): the outages the rounds show, as JSON
    (:func:`wagma.ensemble_coordinator.fault_events`: rank, late or dead,
    the round and step it missed, how long the others waited, where a late
    rank rejoined).
``summary`` attributes (complete runs): ``throughput`` (samples/s over all
    ranks), ``steps_per_second``, ``train_time``, ``steps``, ``samples``,
    ``final_accuracy``, ``best_accuracy``, ``last_epoch_accuracy`` (the
    mean of the last epoch's evaluations), ``mean_wait_time``,
    ``stale_fraction`` (and the straggler predictor's two, above); :func:`summarize` recomputes them from the datasets
    for any file, a partial one included.

Rank 0 writes; the other ranks send their rows as they go (a
:class:`~collectives.collect.RootCollector`, which never makes a rank wait
for another).  While the run lasts the file is ``NAME.partial.h5``, opened,
appended to and closed again at most every ``flush_seconds``, so a run that
dies keeps what it measured up to the last flush in a readable file; at the
end it is renamed to ``NAME.h5`` in one ``os.replace``.
"""

import json
import math
import os
import time
from dataclasses import dataclass, field

import h5py
import numpy as np

from collectives.collect import RootCollector

__all__ = ["EVAL_FIELDS", "STEP_FIELDS", "Run", "RunRecorder", "is_partial", "last_epoch_accuracy", "load_run",
           "partial_path", "straggler_summary", "summarize", "write_run"]

SCHEMA = "wagma-run/1"
STEP_FIELDS = ("step_time", "compute_time", "delay", "comm_time", "wait_time", "loss", "stale", "clock", "samples",
               "skipped", "contribution")
#: Step fields that files of an earlier version lack, and how they read.
_LATER_STEP_FIELDS = {"samples": lambda attrs: float(attrs.get("batch_size", 0)), "skipped": lambda attrs: 0.0,
                      "contribution": lambda attrs: np.nan}
EVAL_FIELDS = ("step", "epoch", "clock", "accuracy", "loss")
_CHUNK = 256


_PARTIAL = ".partial.h5"


def partial_path(path: str) -> str:
    """Where a run writes ``path`` while it is not finished."""
    stem = path[:-3] if path.endswith(".h5") else path
    return stem + _PARTIAL


def is_partial(path: str) -> bool:
    """True for the name a run has while it is not finished (:func:`partial_path`)."""
    return os.path.basename(path).endswith(_PARTIAL)


def _attr(value):
    """An HDF5-storable attribute value (dicts and None as JSON; str
    subclasses such as ``torch.__version__`` as plain str)."""
    if isinstance(value, str):
        return str(value)
    if isinstance(value, (dict, list, tuple)) and not (
            isinstance(value, (list, tuple)) and value and all(isinstance(v, (int, float)) for v in value)):
        return json.dumps(value)
    return "null" if value is None else value


class _FileWriter:
    """The root's side: appends rows and evaluations to the partial file."""

    def __init__(self, path, attrs, ranks, resume_step):
        self.path, self.partial, self.ranks = path, partial_path(path), ranks
        self.next_step = np.zeros(ranks, dtype=np.int64)
        self._rows, self._evals, self._tables = [], [], {}
        os.makedirs(os.path.dirname(os.path.abspath(self.partial)), exist_ok=True)
        if resume_step is not None and os.path.exists(self.partial):
            self._reopen(resume_step)
        else:
            self._create(attrs, resume_step or 0)

    def _create(self, attrs, first_step):
        with h5py.File(self.partial, "w") as f:
            f.attrs.update({k: _attr(v) for k, v in attrs.items()})
            f.attrs.update(schema=SCHEMA, status="running",
                           resumed_at=np.array([first_step] if first_step else [], dtype=np.int64))
            steps = f.create_group("steps")
            for name in STEP_FIELDS:
                steps.create_dataset(name, shape=(self.ranks, first_step), maxshape=(self.ranks, None),
                                     dtype="f8", chunks=(self.ranks, _CHUNK), fillvalue=np.nan)
            steps.attrs["written"] = first_step
            ev = f.create_group("eval")
            for name in EVAL_FIELDS:
                ev.create_dataset(name, shape=(0,), maxshape=(None,), dtype="f8", chunks=(_CHUNK,))
            ev.create_dataset("replica_accuracy", shape=(0, self.ranks), maxshape=(None, self.ranks),
                              dtype="f8", chunks=(_CHUNK, self.ranks), fillvalue=np.nan)
        self.next_step[:] = first_step

    def _reopen(self, step):
        """Continue an interrupted run's file from its checkpoint at ``step``."""
        with h5py.File(self.partial, "a") as f:
            for name in STEP_FIELDS:
                ds = f["steps"][name]
                ds.resize(min(ds.shape[1], step), axis=1)
            f["steps"].attrs["written"] = min(int(f["steps"].attrs["written"]), step)
            keep = int(np.sum(f["eval"]["step"][:] <= step))
            for name in (*EVAL_FIELDS, "replica_accuracy"):
                f["eval"][name].resize(keep, axis=0)
            f.attrs["resumed_at"] = np.append(f.attrs["resumed_at"], step).astype(np.int64)
            f.attrs["status"] = "running"
        self.next_step[:] = step

    def add_rows(self, rank, rows):
        if len(rows):
            self._rows.append((rank, rows))

    def add_eval(self, values, replica_accuracy):
        self._evals.append(([values[k] for k in EVAL_FIELDS], replica_accuracy))

    def set_table(self, name, rows, columns):
        """Table ``sync/<name>`` as it is now (its earlier rows unchanged), for the next flush."""
        self._tables[name] = (np.asarray(rows, dtype=np.float64), columns)

    def flush(self, status=None, summary=None, attrs=None):
        if not (self._rows or self._evals or self._tables or status or summary or attrs):
            return
        with h5py.File(self.partial, "a") as f:
            for name, (rows, columns) in self._tables.items():
                # Tables only grow: the new rows are appended to a chunked
                # dataset (rewriting it at every flush would leave the old
                # copies' space unreclaimed in the file).
                group = f.require_group("sync")
                if name not in group:
                    group.create_dataset(name, shape=(0, rows.shape[1]), maxshape=(None, rows.shape[1]),
                                         dtype="f8", chunks=(_CHUNK, rows.shape[1]))
                    group[name].attrs["columns"] = json.dumps(columns)
                table, old = group[name], group[name].shape[0]
                table.resize(rows.shape[0], axis=0)
                table[old:] = rows[old:]
            if attrs:
                f.attrs.update({k: _attr(v) for k, v in attrs.items()})
            steps = f["steps"]
            if self._rows:
                end = max(int(rows[:, 0].max()) + 1 for _, rows in self._rows)
                if end > steps[STEP_FIELDS[0]].shape[1]:
                    for name in STEP_FIELDS:
                        steps[name].resize(end, axis=1)
                by_rank = {}
                for rank, rows in self._rows:
                    by_rank.setdefault(rank, []).append(rows)
                for rank, blocks in by_rank.items():
                    # One rank's rows arrive in order and consecutively: one slab per rank and field.
                    rows = np.concatenate(blocks)
                    lo, hi = int(rows[0, 0]), int(rows[-1, 0]) + 1
                    for i, name in enumerate(STEP_FIELDS, start=1):
                        steps[name][rank, lo:hi] = rows[:, i]
                    self.next_step[rank] = max(self.next_step[rank], hi)
            steps.attrs["written"] = int(self.next_step.min())
            if self._evals:
                ev, n = f["eval"], f["eval"]["step"].shape[0]
                for name in (*EVAL_FIELDS, "replica_accuracy"):
                    ev[name].resize(n + len(self._evals), axis=0)
                for i, (values, replicas) in enumerate(self._evals):
                    for name, value in zip(EVAL_FIELDS, values):
                        ev[name][n + i] = value
                    if replicas is not None:
                        ev["replica_accuracy"][n + i] = replicas
            if summary:
                f.require_group("summary").attrs.update({k: _attr(v) for k, v in summary.items()})
            if status:
                f.attrs["status"] = status
        self._rows, self._evals, self._tables = [], [], {}


class RunRecorder:
    """Every rank's per-step measurements, into one run file written by rank 0.

    Collective to construct and to :meth:`close`; :meth:`record` never
    communicates synchronously (rows leave in blocks of ``post_every``).

    Args:
        comm: an ``mpi4py.MPI.Intracomm`` over the run's ranks.
        path: the final file name (``.h5``); the partial one is
            :func:`partial_path` of it.
        attrs: root attributes (the configuration and provenance).
        resume_step: continue the partial file of an interrupted run from
            this step (rows at and after it are dropped), or start a new
            file whose first ``resume_step`` columns are empty; None for a
            fresh run.
        flush_seconds: how often rank 0 rewrites the partial file at most.
        post_every: steps a rank buffers before sending them (1: a rank that
            is killed loses no step it finished).
    """

    def __init__(self, comm, path, attrs, *, resume_step=None, flush_seconds=2.0, post_every=8):
        self.ranks = comm.Get_size()
        self.collector = RootCollector(comm, 1 + len(STEP_FIELDS))
        self.writer = _FileWriter(path, attrs, self.ranks, resume_step) \
            if self.collector.is_root else None
        self.flush_seconds, self.post_every = flush_seconds, post_every
        self._buffer, self._last_flush = [], time.monotonic()

    @property
    def path(self):
        return self.writer.path if self.writer else None

    def record(self, step: int, **values):
        """This rank's measurements of ``step`` (the :data:`STEP_FIELDS`)."""
        self._buffer.append([step, *(values[k] for k in STEP_FIELDS)])
        if len(self._buffer) >= self.post_every:
            self.collector.post(np.array(self._buffer))
            self._buffer = []
        if self.writer:
            self._drain()
            if time.monotonic() - self._last_flush >= self.flush_seconds:
                self.flush()

    def record_table(self, name, rows, columns):
        """On rank 0: the whole table ``sync/<name>`` so far, whose rows
        only ever grow (the new ones are written at the next flush, so a run
        that fails keeps it up to then)."""
        if self.writer:
            self.writer.set_table(name, rows, columns)

    def record_eval(self, replica_accuracy=None, **values):
        """On rank 0: one evaluation (the :data:`EVAL_FIELDS`)."""
        if self.writer:
            self.writer.add_eval(values, replica_accuracy)

    def _drain(self):
        for rank, rows in self.collector.poll():
            self.writer.add_rows(rank, rows)

    def flush(self):
        """Rank 0: write what has arrived (local; the others: nothing)."""
        if self.writer:
            self._drain()
            self.writer.flush()
            self._last_flush = time.monotonic()

    def close(self, status: str, dead=(), attrs=None):
        """Collective over the living ranks: gather every rank's remaining
        rows, write the :func:`summarize` figures and ``status``;
        ``"complete"`` renames the file to its final name.  ``dead``: ranks
        that died (ULFM), not waited for; their rows end where they died,
        and the root attribute ``dead_ranks`` lists them.  ``attrs``: more
        root attributes (rank 0's).  Returns the path written (rank 0) or None."""
        if self._buffer:
            self.collector.post(np.array(self._buffer))
            self._buffer = []
        for rank, rows in self.collector.finish(absent=dead):
            self.writer.add_rows(rank, rows)
        self.collector.close()
        if not self.writer:
            return None
        self.writer.flush(attrs={**(attrs or {}), "dead_ranks": json.dumps(sorted(dead))})
        if dead:        # the others' steps count as written past the dead ranks' last one
            alive = [r for r in range(self.ranks) if r not in set(dead)]
            self.writer.next_step[list(dead)] = self.writer.next_step[alive].min() if alive else 0
            self.writer.flush(summary={"dead_ranks": len(dead)})
        self.writer.flush(status=status, summary=summarize(load_run(self.writer.partial)))
        if status != "complete":
            return self.writer.partial
        os.replace(self.writer.partial, self.writer.path)
        return self.writer.path

    def abandon(self, status: str = "failed"):
        """After an error, without communicating: rank 0 writes what has
        arrived and marks the partial file with ``status``."""
        if self.writer:
            self._drain()
            self.writer.flush(status=status)


def write_run(path: str, attrs: dict, steps: dict, evals: dict | None = None,
              status: str = "complete"):
    """Write a whole run file at once (the simulator's results, test fixtures).

    ``steps``: every :data:`STEP_FIELDS` name -> a ``(P, T)`` array;
    ``evals``: :data:`EVAL_FIELDS` names (and optionally
    ``replica_accuracy``, ``(E, P)``) -> arrays of one length.  The summary
    is :func:`summarize`'s.
    """
    steps = {**{k: np.full(np.shape(steps["clock"]), default(attrs)) for k, default in _LATER_STEP_FIELDS.items()},
             **steps}
    missing = [k for k in STEP_FIELDS if k not in steps]
    if missing:
        raise ValueError(f"steps is missing {', '.join(missing)}")
    ranks, count = np.shape(steps["clock"])
    writer = _FileWriter(path, attrs, ranks, None)
    with h5py.File(writer.partial, "a") as f:      # whole arrays at once, not rank by rank
        for name in STEP_FIELDS:
            f["steps"][name].resize(count, axis=1)
            f["steps"][name][...] = np.asarray(steps[name], dtype=np.float64)
        f["steps"].attrs["written"] = count
    writer.next_step[:] = count
    evals = evals or {}
    for i in range(len(evals.get("step", ()))):
        replicas = evals["replica_accuracy"][i] if "replica_accuracy" in evals else None
        writer.add_eval({k: evals[k][i] for k in EVAL_FIELDS}, replicas)
    writer.flush()
    run = load_run(writer.partial)
    writer.flush(status=status, summary=summarize(run))
    os.replace(writer.partial, path)


@dataclass
class Run:
    """A run file's content: attributes, the written steps, evaluations, summary."""

    path: str
    attrs: dict
    steps: dict = field(default_factory=dict)       # field -> (P, written) array
    eval: dict = field(default_factory=dict)        # field -> (E,) array
    summary: dict = field(default_factory=dict)
    tables: dict = field(default_factory=dict)      # sync/<name> by name -> array (rounds, stragglers)

    @property
    def config(self) -> dict:
        return json.loads(self.attrs.get("config", "{}"))


def _plain(value):
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, np.generic):
        return value.item()
    return value


def load_run(path: str) -> Run:
    """Read a run file (complete or partial) into memory; the summary is
    :func:`summarize`'s, with the stored one's values where present."""
    with h5py.File(path, "r") as f:
        if f.attrs.get("schema") != SCHEMA:
            raise ValueError(f"{path}: not a run file of schema {SCHEMA!r} "
                             f"(got {f.attrs.get('schema')!r})")
        attrs = {k: _plain(v) for k, v in f.attrs.items()}
        written = int(f["steps"].attrs["written"])
        steps = {k: f["steps"][k][:, :written] for k in STEP_FIELDS if k in f["steps"]}
        for name, default in _LATER_STEP_FIELDS.items():
            if name not in steps:
                steps[name] = np.full_like(steps["clock"], default(attrs))
        evals = {k: f["eval"][k][:] for k in f["eval"]}
        tables = {k: f["sync"][k][:] for k in f["sync"]} if "sync" in f else {}
        stored = {k: _plain(v) for k, v in f["summary"].attrs.items()} if "summary" in f else {}
    run = Run(path, attrs, steps, evals, tables=tables)
    run.summary = {**summarize(run), **stored}
    return run


def straggler_summary(rows) -> dict:
    """The straggler predictor's record from table ``sync/stragglers``:
    ``stragglar_fraction`` (global synchronizations run as StragglAR, with a
    predicted straggler), ``straggler_hit_rate`` (of those, the ones whose
    predicted rank arrived last; NaN with none), and the counts
    ``straggler_syncs``, ``straggler_predictions`` and ``straggler_hits``."""
    rows = np.asarray(rows)
    predicted = rows[:, 1] >= 0
    hits = predicted & (rows[:, 1] == rows[:, 2])
    return {"stragglar_fraction": float(predicted.mean()),
            "straggler_hit_rate": float(hits.sum() / predicted.sum()) if predicted.any() else math.nan,
            "straggler_syncs": int(rows.shape[0]), "straggler_predictions": int(predicted.sum()),
            "straggler_hits": int(hits.sum())}


def summarize(run: Run, skip: int = 0) -> dict:
    """Throughput and accuracy figures of a run, from its datasets.

    Throughput counts every rank's samples (``steps/samples``: skipped
    steps and a dead rank's missing ones count none) of steps ``skip .. written - 1``
    over the time from the latest rank's end of step ``skip - 1`` (the run's
    start when ``skip`` is 0) to the latest rank's end of the last step, on
    the training clock: what a user waits for, evaluation excluded.
    """
    clock = run.steps["clock"]
    written = clock.shape[1]
    samples = run.steps.get("samples")
    if samples is None:         # a run made in memory (the simulator) without the field
        samples = np.full_like(clock, _LATER_STEP_FIELDS["samples"](run.attrs))
    out = {"steps": written, "samples": float(np.nansum(samples))}
    if written > skip:
        start = float(np.nanmax(clock[:, skip - 1])) if skip else 0.0
        elapsed = float(np.nanmax(clock[:, -1])) - start
        out["train_time"] = float(np.nanmax(clock[:, -1]))
        if elapsed > 0:
            out["steps_per_second"] = (written - skip) / elapsed
            out["throughput"] = float(np.nansum(samples[:, skip:])) / elapsed
        out["mean_wait_time"] = float(np.nanmean(run.steps["wait_time"]))
        out["stale_fraction"] = float(np.nanmean(run.steps["stale"]))
    stragglers = run.tables.get("stragglers")
    if stragglers is not None and len(stragglers):
        out.update(straggler_summary(stragglers))
    accuracy = run.eval.get("accuracy", np.zeros(0))
    if accuracy.size and np.any(np.isfinite(accuracy)):
        out["final_accuracy"] = float(accuracy[-1])
        out["best_accuracy"] = float(np.nanmax(accuracy))
        out["last_epoch_accuracy"] = last_epoch_accuracy(run)
    return out


def last_epoch_accuracy(run: Run) -> float:
    """The mean accuracy of the evaluations of the last epoch trained: those
    whose epoch lies within one epoch of the last evaluation's, that one
    included (NaN ones left out).  A final evaluation alone decides a
    comparison by one noisy snapshot; with several evaluations an epoch
    (``experiments.train --eval-every 0.25``) this is their mean.  Evaluated
    once an epoch, it is the final accuracy."""
    accuracy = np.asarray(run.eval["accuracy"], dtype=np.float64)
    epoch = np.asarray(run.eval["epoch"], dtype=np.float64)
    last = epoch > epoch[-1] - 1 + 1e-9
    return float(np.nanmean(accuracy[last]))
