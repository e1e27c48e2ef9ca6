"""The run file's schema: one HDF5 file per training run.

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
    :func:`collectives.provenance.run_attributes` (host names, MPI
    library, git commit, start time...) plus ``torch_version``.

``steps/<field>``: float64 ``[rank, step]``, NaN where nothing arrived
    ================  ============================================================
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
                      step's averaging (:attr:`wagma.algorithms.base.Algorithm.contribution`:
                      WAGMA-SGD's model, eager-SGD's gradient),
                      what :mod:`wagma.emulate` replays; NaN for the others
    ``bytes_sent``    the bytes the rank sent to average in the step
                      (:attr:`wagma.algorithms.base.Algorithm.bytes_sent`: the
                      encoded bytes under ``compression``, else what a
                      bandwidth-optimal allreduce sends, or the point-to-point
                      messages' bytes)
    ================  ============================================================

    (files written before ``samples``, ``skipped``, ``contribution`` and
    ``bytes_sent`` existed read as ``batch_size``, 0, NaN and NaN.)  Row ``r`` is the rank ``r``
    of the communicator the run began on, whatever membership changes
    followed.  A rank that died has NaN from its death on.
    attribute ``steps.attrs["written"]``: while the run writes, every member
    rank's rows are present for steps ``0 .. written - 1`` (the ranks that
    left, ``membership/left``, do not hold it back); once the run is
    closed, the steps of the members that finished; in a file that
    ``python -m wagma.results complete`` closed after its job died (every
    rank gone), the furthest step any rank reached, the others' rows NaN
    past their last step.

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
    see :mod:`collectives.stragglar.training_sync`; the summary's
    ``stragglar_fraction`` and ``straggler_hit_rate`` come from it (over
    the whole run: the predictor's warm-up included).
``sync/exchanges`` (adpsgd, complete runs): one row per exchange and side,
    in each rank's order: rank, peer, active (1 on the side that asked),
    copied_after and applied_after (the rank's updates done when it copied
    its model and when it added its half difference); what
    :func:`wagma.emulate.schedule.logged_schedule` replays.
``membership/<field>`` (runs whose ranks changed): one row per rank that
    left, per membership change, as
    :meth:`~wagma.results.recorder.RunRecorder.record_membership` recorded
    it: ``step`` (the first step the survivors ran after the change),
    ``clock`` (the training clock when it was noticed; for a ``relaunch``,
    the checkpoint's, which the survivors went on from: the training since
    it was done again), ``left`` (the rank
    that left, numbered as its row of ``steps/``), ``noticed`` (how it was
    noticed: a code of :data:`NOTICED`, whose names
    ``membership.attrs["noticed"]`` holds as JSON), ``recovery_s`` (seconds
    from noticing it to going on; for a ``relaunch``, from the death to the
    relaunched survivors' first step) and ``ranks_after`` (the ranks the run
    had after it).  A change that loses two ranks is two rows with the
    same step and clock.  Replacements that join (:mod:`wagma.healing`)
    are rows too: ``noticed`` ``joined``, ``left`` the row the replacement
    took (it is a member again), ``step`` the first step it ran, and
    ``recovery_s`` from the spawn to every member ready; an attempt whose
    processes were refused (no proof of the job's secret, or none in time)
    is a ``refused`` row with ``left`` -1.  :func:`gone_rows` reads who is
    gone at the end.
Root attribute ``chaos`` (runs with ``--chaos``, :mod:`wagma.chaos`): the
    plan as JSON (``mtbf``, ``kinds``, ``seed``, ``hang``, ``keep``,
    ``rows``) and its first ``events`` (wall-clock seconds from the start
    of the first step, row, kind); the deaths are ``membership/`` rows.
Root attribute ``dead_ranks``: the ranks that died during the run (JSON list);
    ``fault_events`` (ensemble_sync): the outages the rounds show, as JSON
    (:func:`wagma.ensemble_coordinator.fault_events`: rank, late or dead,
    the round and step it missed, how long the others waited, where a late
    rank rejoined).
``summary`` attributes (complete runs): ``throughput`` (samples/s over all
    ranks), ``steps_per_second``, ``train_time``, ``steps``, ``samples``,
    ``final_accuracy``, ``best_accuracy``, ``last_epoch_accuracy`` (the
    mean of the last epoch's evaluations), ``mean_wait_time``,
    ``stale_fraction`` (and the straggler predictor's two, above; with
    membership changes ``membership_changes``, ``ranks_left``,
    ``ranks_joined`` and ``recovery_s``, summed over the changes);
    :func:`~wagma.results.summary.summarize` recomputes them from the datasets
    for any file, a partial one included.

While the run lasts the file is ``NAME.partial.h5`` (:func:`partial_path`)
and every rank appends its rows to its own log in ``NAME.partial.rows/``
(:func:`rows_path`, :mod:`wagma.results.journal`), from which the file is
brought up to date; at the end it is renamed to ``NAME.h5`` in one
``os.replace`` and the logs are removed (:mod:`wagma.results.recorder`).
"""

import os

import numpy as np

__all__ = [
    "EVAL_FIELDS",
    "LATER_STEP_FIELDS",
    "MEMBERSHIP_FIELDS",
    "NOTICED",
    "SCHEMA",
    "STEP_FIELDS",
    "gone_rows",
    "is_partial",
    "partial_path",
    "rows_path",
]

#: The value of the root attribute ``schema``.
SCHEMA = "wagma-run/1"
#: The fields of ``steps/``, as the schema above lists them.
STEP_FIELDS = (
    "step_time",
    "compute_time",
    "delay",
    "comm_time",
    "wait_time",
    "loss",
    "stale",
    "clock",
    "samples",
    "skipped",
    "contribution",
    "bytes_sent",
)
#: Step fields that files of an earlier version lack, and how they read.
LATER_STEP_FIELDS = {
    "samples": lambda attrs: float(attrs.get("batch_size", 0)),
    "skipped": lambda attrs: 0.0,
    "contribution": lambda attrs: np.nan,
    "bytes_sent": lambda attrs: np.nan,
}
#: The fields of ``eval/`` (``replica_accuracy`` aside).
EVAL_FIELDS = ("step", "epoch", "clock", "accuracy", "loss")

#: The fields of ``membership/``, one row per rank that left.
MEMBERSHIP_FIELDS = ("step", "clock", "left", "noticed", "recovery_s", "ranks_after")
#: How a membership change was noticed (``membership/noticed``): ``proc_failed``,
#: an MPI call returned ``MPI_ERR_PROC_FAILED`` (ULFM); ``revoked``, a peer
#: revoked the communicator (``MPI_ERR_REVOKED``); ``progress_thread``, an
#: algorithm's progress thread met the failure and told the training loop;
#: ``timeout``, a peer did not answer within the algorithm's deadline;
#: ``request_failed``, a multiple completion (``MPI_Waitall``) one of whose
#: transfers failed (``MPI_ERR_IN_STATUS``); ``relaunch``, without fault
#: tolerance: the job ended when the rank died and was started again on the
#: ranks left, from the last checkpoint (``experiments.checkpoint``);
#: ``joined``, a replacement took the row (``left``); ``refused``, processes
#: started as replacements were not admitted (``left`` -1).
NOTICED = {
    "proc_failed": 0,
    "revoked": 1,
    "progress_thread": 2,
    "timeout": 3,
    "request_failed": 4,
    "relaunch": 5,
    "joined": 6,
    "refused": 7,
}


def gone_rows(membership: np.ndarray) -> set[int]:
    """The rows not members at the end of ``membership/``'s rows (an
    ``(n, len(MEMBERSHIP_FIELDS))`` array): those that left and were not
    taken by a replacement later, in the order of step and clock."""
    step, clock, row, noticed = (MEMBERSHIP_FIELDS.index(k) for k in ("step", "clock", "left", "noticed"))
    gone: set[int] = set()
    for entry in sorted(
        np.asarray(membership).tolist(), key=lambda e: (e[step], e[clock], e[noticed] == NOTICED["joined"])
    ):
        if entry[noticed] == NOTICED["joined"]:
            gone.discard(int(entry[row]))
        elif entry[noticed] != NOTICED["refused"]:
            gone.add(int(entry[row]))
    return gone


_PARTIAL = ".partial.h5"
_ROWS = ".partial.rows"


def partial_path(path: str) -> str:
    """Where a run writes ``path`` while it is not finished."""
    stem = path[:-3] if path.endswith(".h5") else path
    return stem + _PARTIAL


def is_partial(path: str) -> bool:
    """True for the name a run has while it is not finished (:func:`partial_path`)."""
    return os.path.basename(path).endswith(_PARTIAL)


def rows_path(path: str) -> str:
    """The folder of the row logs beside the run file ``path`` (final or partial name):
    ``NAME.partial.rows``."""
    stem = path[: -len(_PARTIAL)] if path.endswith(_PARTIAL) else path[:-3] if path.endswith(".h5") else path
    return stem + _ROWS
