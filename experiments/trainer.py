"""One training run of ``experiments.train``: set-up agreed by all ranks, the step loop, evaluations, checkpoints."""

import argparse
import itertools
import json
import logging
import math
import signal
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from mpi4py import MPI

from collectives import Communicator
from collectives.agreement import agree
from collectives.collect import LaggedVote
from collectives.failures import every_one_done, failed_ranks, fault_tolerant, hold, mpi_failure, revoke_tracked
from collectives.provenance import run_attributes
from collectives.spares import SparePool
from wagma.algorithms import Algorithm, create
from wagma.chaos import ChaosMonkey, parse_chaos
from wagma.clock import TrainingClock
from wagma.datasets import Dataset
from wagma.faults import FaultInjector, parse_faults
from wagma.healing import join, replace
from wagma.imbalance import parse_imbalance
from wagma.membership import survive
from wagma.models import build_model
from wagma.options import resolved_options
from wagma.options.cli import options_from_args
from wagma.options.fit import fit_options
from wagma.results import STEP_FIELDS, RunRecorder

from .build import dataset_of, optimizer_of
from .checkpoint import Latest, load_checkpoint, read_latest, save_checkpoint
from .compute import StepCompute
from .evaluate import Evaluator
from .options import UsageError, compute_ms, default_out, usage_problem
from .progress import StepProgress
from .schedule import LearningRate

__all__ = ["join_training", "train"]

logger = logging.getLogger(__name__)


class _StopRequest:
    """Set by SIGTERM / SIGUSR1 (what Slurm sends before the time limit)."""

    def __init__(self):
        self.requested = False
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            signal.signal(sig, self._handler)

    def _handler(self, signum, frame):
        self.requested = True


def _planned_steps(args, dataset):
    """The run's steps: ``--epochs`` of ``--batch-size`` batches, at most ``--max-steps``."""
    total = dataset.steps_per_epoch(args.batch_size) * args.epochs
    return min(total, args.max_steps) if args.max_steps else total


@dataclass
class _Rows:
    """Which rows of the run this job's ranks are: ``members[rank]`` is
    rank ``rank``'s row (its rank in the run's first job: its data shard,
    its imbalance and faults, its row of the run file), ``rows`` how many
    ranks the run began with.  A run resumed on the ranks left after ranks
    died (:mod:`experiments.checkpoint`) has fewer members than rows."""

    members: list[int]
    rows: int
    #: The checkpoint the run resumes from, if any.
    latest: Latest | None = None


def _rows_of(args, comm):
    """The rows of ``comm``'s ranks, and the problem with the checkpoint to
    resume from on this rank (None)."""
    unchanged = _Rows(list(range(comm.size)), comm.size)
    if not (args.resume and args.checkpoint_dir):
        return unchanged, None
    try:
        latest = read_latest(args.checkpoint_dir, comm.rank, comm.size)
    except (ValueError, OSError, KeyError) as exc:
        return unchanged, str(exc)
    return (unchanged if latest is None else _Rows(latest.members, latest.rows, latest)), None


def _setup(args, comm):
    """Everything that can fail because of the command line or the files, agreed
    on by all ranks before any training message is sent."""
    rows, problem = _rows_of(args, comm)
    # The command line was written for the run's first rank count; on the ranks left after ranks died its
    # options are fitted by the survivors' rule (_options).
    problem = usage_problem(args, rows.rows) or problem
    row = rows.members[comm.rank]
    dataset, model, imbalance, faults = None, None, None, []
    if problem is None:
        try:
            imbalance = parse_imbalance(args.imbalance, rows.rows, args.seed)
            dataset = dataset_of(args, row, rows.rows)
            torch.manual_seed(args.seed)
            model = build_model(args.model, dataset.spec)
        except (ValueError, FileNotFoundError) as exc:
            problem = str(exc)
    if problem is None:
        try:
            dataset.steps_per_epoch(args.batch_size)
        except ValueError as exc:
            problem = f"--batch-size: {exc}"
    if problem is None:
        try:
            faults = parse_faults(args.fault, rows.rows, _planned_steps(args, dataset))
        except ValueError as exc:
            problem = str(exc)
    chaos = None
    if problem is None and args.chaos is not None:
        try:
            chaos = parse_chaos(args.chaos, rows.rows, args.seed)
        except ValueError as exc:
            problem = str(exc)
    if problem is None and args.algo == "ensemble_sync":
        for spec, fault in zip(args.fault or (), faults):
            if fault.rank == 0 and fault.kind == "stop":
                problem = (
                    f"--fault {spec!r}: rank 0 runs ensemble_sync's coordinator, and the others wait for "
                    f"its decisions while it is stopped; stop another rank"
                )
                break
    if problem is None and args.device == "cuda" and not torch.cuda.is_available():
        problem = "--device cuda: torch sees no CUDA device"
    try:
        agree(comm, "experiments.train", problem, step=rows.latest.step if rows.latest else -1)
    except ValueError as exc:
        raise UsageError(str(exc).removeprefix("experiments.train: ")) from None
    return rows, dataset, model, imbalance, FaultInjector(faults, row), chaos


def _options(args, rows, ranks):
    """The algorithm's options: the command line's resolved for the run's
    first rank count (returned first) and, on fewer ranks (a run resumed on
    the ranks left), fitted to ``ranks`` by the rule the survivors of a
    dead rank follow (:func:`wagma.options.fit.fit_options`); and the
    adjustments, in words."""
    first = resolved_options(args.algo, rows.rows, options_from_args(args, args.algo)).as_dict()
    if ranks == rows.rows:
        return first, first, []
    try:
        return first, *fit_options(args.algo, first, ranks)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _device(args, world):
    if args.device == "cpu":
        return torch.device("cpu")
    local = world.Split_type(MPI.COMM_TYPE_SHARED)
    index = local.Get_rank() % torch.cuda.device_count()
    local.Free()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def _attributes(args, comm, options, model, dataset, total_steps, steps_per_epoch):
    return {
        **run_attributes(comm.control),
        "kind": "measured",
        "config": json.dumps({**vars(args), "algorithm_options": options}, default=str),
        "algorithm": args.algo,
        "group_size": options.get("group_size", 0),
        "tau": options.get("tau", options.get("period", 0)),
        "imbalance": args.imbalance,
        "compute": args.compute,
        "compute_ms": compute_ms(args),
        "model": args.model,
        "dataset": args.dataset,
        "parameters": sum(p.numel() for p in model.parameters()),
        "batch_size": args.batch_size,
        "seed": args.seed,
        "steps_planned": total_steps,
        "steps_per_epoch": steps_per_epoch,
        "torch_version": torch.__version__,
    }


class _UpdateTimer:
    """Seconds spent in ``optimizer.step()`` since :attr:`seconds` was reset
    (the optimizer's step hooks), to tell the update from the waiting in an
    algorithm's ``step()``."""

    def __init__(self, optimizer):
        self.seconds, self._start = 0.0, 0.0
        self._hooks = [optimizer.register_step_pre_hook(self._enter), optimizer.register_step_post_hook(self._exit)]

    def _enter(self, *args):
        self._start = time.perf_counter()

    def _exit(self, *args):
        self.seconds += time.perf_counter() - self._start

    def remove(self):
        for hook in self._hooks:
            hook.remove()


@dataclass
class _Run:
    """What the step loop works with: the command line, the communicators
    (``world``, and ``comm``, the duplicate the algorithm owns), the task and
    the algorithm, the injected imbalance and faults, the run file, and the
    steps: ``steps_per_epoch``, ``total`` planned."""

    args: argparse.Namespace
    world: MPI.Intracomm
    comm: Communicator
    dataset: Dataset
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    algo: Algorithm
    imbalance: object
    faults: FaultInjector
    recorder: RunRecorder
    steps_per_epoch: int
    total: int
    #: The checkpoint the run resumed from, if any.
    latest: Latest | None = None
    #: Options fitted to a smaller rank count so far: ``{"step", "adjustment"}`` (a sentence).
    adjustments: list = field(default_factory=list)
    #: What a replacement runs (``[python, -m, experiments.train, *argv]``), and how many may still join.
    command: list = field(default_factory=list)
    replacements_left: int = 0
    #: The job's spares (``--spares``), which replace dead ranks in place of spawned processes.
    spares: SparePool | None = None
    #: This process's share of ``--chaos``, started with the steps, and the plan's time zero.
    chaos: ChaosMonkey | None = None
    chaos_start: float | None = None

    def checkpoint(self, step: int, clock: float):
        """Collective: the model, optimizer, algorithm and RNG state after ``step`` steps."""
        with self.algo.lock:  # the model and what the algorithm holds for it, at one moment
            state = {
                "model": {k: v.clone() for k, v in self.model.state_dict().items()},
                "optimizer": self.optimizer.state_dict(),
                "algorithm": self.algo.state_dict(),
            }
        state.update(torch_rng=torch.get_rng_state(), step=step, clock=clock)
        members = self.algo.membership.original_ranks
        save_checkpoint(self.comm, self.args.checkpoint_dir, step, state, members, self.recorder.ranks)


def train(args, world, comm, command=(), spares=None):
    """Runs the training that ``args`` describe on ``comm`` (a duplicate of
    ``world``, the job's ranks that are not spares); returns ``"complete"``,
    ``"stopped"`` (at a checkpoint, by a signal) or ``"nothing to do"`` (the
    checkpoint is at the end already).  ``command``: what a replacement for
    a dead rank runs (``--replace``), this program with this command line;
    ``spares``: the job's :class:`~collectives.spares.SparePool` (``--spares``).

    Raises:
        UsageError: on every rank, for a problem with the command line or the
            files, found before the model is built and before any training
            message is sent.
    """
    rows, dataset, model, imbalance, faults, chaos = _setup(args, comm)
    device = _device(args, world)
    model.to(device)
    torch.set_num_threads(args.threads)
    first_options, options, adjustments = _options(args, rows, comm.size)
    optimizer = optimizer_of(args, model)
    try:
        algo = create(args.algo, model, optimizer, comm, **options)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    membership = algo.membership
    membership.original_ranks, membership.rows, membership.options = list(rows.members), rows.rows, first_options
    steps_per_epoch = dataset.steps_per_epoch(args.batch_size)
    total = _planned_steps(args, dataset)
    algo.plan(total, args.batch_size)
    faults.arm(optimizer, lambda: algo.steps)
    start, clock_offset = 0, 0.0
    if rows.latest is not None and rows.latest.step > 0:  # step 0: the seeded start, no files
        state = load_checkpoint(comm, args.checkpoint_dir, rows.latest.step, rows.members[comm.rank])
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        algo.load_state_dict(state["algorithm"])
        torch.set_rng_state(state["torch_rng"])
        start, clock_offset = state["step"], state["clock"]
    if start >= total:
        if comm.rank == 0:
            logger.info(
                "the checkpoint in %s is at step %d of %d: nothing left to run", args.checkpoint_dir, start, total
            )
        algo.close()
        return "nothing to do"
    out = args.out or default_out(args, rows.rows)
    recorder = RunRecorder(
        world,
        out,
        {
            **_attributes(args, comm, options, model, dataset, total, steps_per_epoch),
            "ranks": rows.rows,
            "faults": faults.record(),
            **({"chaos": chaos.record()} if chaos else {}),
        },
        resume_step=start if args.resume else None,
        members=rows.members,
    )
    run = _Run(args, world, comm, dataset, model, optimizer, algo, imbalance, faults, recorder, steps_per_epoch, total)
    run.latest, run.adjustments = rows.latest, [{"step": start, "adjustment": a} for a in adjustments]
    run.command, run.replacements_left, run.spares = list(command), args.replace or args.spares, spares
    run.chaos = ChaosMonkey(chaos, rows.members[comm.rank], lambda: _members_alive(run)) if chaos else None
    return _run_to_end(run, start, clock_offset)


def join_training(args, command=(), spares=None, called=None):
    """The run of a replacement the survivors started (``--replace``), or
    of a spare they called (``--spares``: ``called``, the communicator its wait returned):
    build the model and optimizer as every rank did, join the job with a
    living rank's state (:func:`wagma.healing.join`: the step, the model,
    the optimizer and the algorithm's state; the row of a rank that died),
    take that row's data shard, imbalance and faults, continue its rows of
    the run file, and train to the end with the others.  Returns the run's
    status, as :func:`train`.

    Raises:
        PermissionError: the job refused this process (no proof of its secret).
    """
    probe = dataset_of(args, 0, 1)  # for the model's shapes; the row's own data comes after the join
    torch.manual_seed(args.seed)
    model = build_model(args.model, probe.spec)  # the architecture: join replaces the values
    device = _device(args, MPI.COMM_SELF)
    model.to(device)
    torch.set_num_threads(args.threads)
    optimizer = optimizer_of(args, model)
    algo, row = join(model, optimizer, spare=called)
    rows = algo.membership.rows
    dataset = dataset_of(args, row, rows)
    steps_per_epoch = dataset.steps_per_epoch(args.batch_size)
    total = _planned_steps(args, dataset)
    algo.plan(total, args.batch_size)
    faults = FaultInjector(parse_faults(args.fault, rows, total), row, after=algo.steps)
    faults.arm(optimizer, lambda: algo.steps)
    imbalance = parse_imbalance(args.imbalance, rows, args.seed)
    world = algo.membership.comm
    run = _Run(args, world, algo.comm, dataset, model, optimizer, algo, imbalance, faults, None, steps_per_epoch, total)
    run.command, run.spares = list(command), spares
    try:
        channels = _Channels(run, args.compute == "real", bool(args.checkpoint_dir))
        run.recorder = RunRecorder.joining(world, args.out or default_out(args, rows), rows, row)
        clock_offset = _record_join(run, algo.membership.changes[-1], None)
    except BaseException as error:
        if mpi_failure(error) is None:
            raise
        _leave_as_failed(row, error)
    if args.chaos is not None:  # the row's failures still to come, on the plan's clock
        plan = parse_chaos(args.chaos, rows, args.seed)
        run.chaos = ChaosMonkey(plan, row, lambda: _members_alive(run))
    return _run_to_end(run, algo.steps, clock_offset, channels)


def _members_alive(run):
    """The members not known dead, for the chaos plan's ``keep``: the
    run's communicator less the failures MPI knows of in it.  Its size
    alone lags while the survivors recover (the communicator is the one
    before the shrink), and in a long chaos run the failures that came
    meanwhile struck all but one member of four despite ``keep=2``."""
    return run.world.Get_size() - len(failed_ranks(run.world))


def _leave_as_failed(row, error):
    """A newcomer whose setup after the join a rank's failure interrupted
    (its loop's channels, its run file's writer, the change recorded): the
    members recover from that failure in their loop, which the newcomer has
    not entered, so it leaves as a failed process, by SIGKILL, as the chaos
    kills, and the members recover from its death too (its row vacant
    again, the next spare called).  Its rows so far are in its row log."""
    logger.warning("row %d failed as it set up its loop after joining (%s): leaving as a failed process", row, error)
    logging.shutdown()
    signal.raise_signal(signal.SIGKILL)


def _run_to_end(run, start, clock_offset, channels=None):
    """The step loop from ``start``, then the end of the run: the
    algorithm closed, the last checkpoint, the run file closed with its
    summary; returns the status."""
    try:
        status, ended = _loop(run, start, clock_offset, channels)
    except BaseException:
        run.recorder.abandon("failed")
        raise
    finally:
        if run.chaos is not None:
            run.chaos.stop()
    algo, recorder = run.algo, run.recorder
    algo.close()  # AD-PSGD's last exchanges land in the model here
    if run.args.checkpoint_dir and status == "complete":
        if run.comm.closed:  # after a membership change the algorithm owned the run's communicator, and closed it
            run.comm = Communicator(run.world)
            run.checkpoint(run.total, ended)
            run.comm.close()
        else:
            run.checkpoint(run.total, ended)
    if run.comm.rank == 0:
        recorder.record_tables(algo.sync_tables())  # as they stand after close (AD-PSGD's exchanges)
    attrs = algo.run_attributes()
    if run.adjustments:
        attrs["option_adjustments"] = json.dumps(run.adjustments)
    path = recorder.close(status, dead=algo.dead_ranks, attrs=attrs)
    if run.spares is not None and run.comm.rank == 0:
        run.spares.release()  # those never called: the run is over
    if path:
        logger.info("%s %s", "wrote" if status == "complete" else "stopped; wrote", path)
    return status


class _Channels:
    """The loop's own communication beside the algorithm's, on ``run.world``:
    the evaluator's communicator and the stop vote (with ``--checkpoint-dir``).
    Built anew on the survivors after a membership change."""

    def __init__(self, run, evaluate, stop):
        args = run.args
        self.eval_comm = Communicator(run.world)
        self.evaluator = (
            Evaluator(run.model, self.eval_comm, run.dataset, max(args.batch_size, 256), lock=run.algo.lock)
            if evaluate
            else None
        )
        self.vote = LaggedVote(run.world, args.stop_check_every) if stop else None

    def close(self):
        """Collective: completes the last vote and frees the communicators."""
        if self.vote is not None:
            self.vote.close()
        self.eval_comm.close()


def _loop(run, start, clock_offset, channels=None):
    """The training steps ``start .. run.total - 1``, then the final
    evaluation (:func:`_final_evaluation`); returns the run's status and
    its training clock then.

    Under MPI fault tolerance a rank's failure, noticed anywhere in a step
    or between steps, is survived (:func:`wagma.membership.survive`): the
    algorithm is rebuilt on the survivors, the loop's own channels and the
    run file follow, the survivors take over the dead ranks' data
    (:meth:`_TrainingData.take_over`), and the loop goes on from the step
    the survivors agreed on.  With ``--replace``, at the next step the
    survivors start replacements for the rows that left
    (:func:`_take_replacements`), which enter this loop with their
    ``channels`` built already, at the survivors' step."""
    args, algo, recorder, total = run.args, run.algo, run.recorder, run.total
    steps_per_epoch, optimizer = run.steps_per_epoch, run.optimizer
    lr = LearningRate(
        args.lr, steps_per_epoch, args.warmup_epochs, args.warmup_start, args.decay_epochs, args.decay_factor
    )
    row = algo.membership.original_rank
    compute = StepCompute(run.model, run.dataset.spec, run.imbalance, args.compute, compute_ms(args), row)
    evaluate = args.compute == "real"
    # Steps between evaluations (0: only at the end); --eval-every 1 is every epoch's end.
    eval_interval = max(1, round(args.eval_every * steps_per_epoch)) if args.eval_every else 0
    progress = StepProgress(total, start, enabled=run.comm.rank == 0 and not args.no_progress)
    # Without a checkpoint to stop at, SIGTERM keeps its default (end the job).
    stop = _StopRequest() if args.checkpoint_dir else None
    joining = channels is not None  # a replacement, which the others are waiting for already
    if not joining:
        channels = _Channels(run, evaluate, stop is not None)
    with progress.redirect():
        update = _UpdateTimer(optimizer)
        if not joining:
            run.comm.control.Barrier()
            # The chaos plan's time zero: rank 0's wall clock as the first step starts, the same on every rank.
            run.chaos_start = run.comm.control.bcast(time.time(), root=0) if run.chaos is not None else None
        if run.chaos is not None:
            run.chaos.start(optimizer, run.chaos_start)
        clock = TrainingClock(clock_offset)
        status, step = "complete", start
        data = _TrainingData(
            run.dataset,
            args.batch_size,
            steps_per_epoch,
            start,
            streaming=bool(algo.options.get("reallocate")),
            needed=evaluate,
        )
        if len(algo.membership.original_ranks) < recorder.ranks:  # resumed on the ranks left after ranks died
            _share_rows_left(run, data)
            if run.comm.rank == 0:
                logger.info(
                    "resumed at step %d on %d of the run's %d ranks (rows %s)",
                    start,
                    run.comm.size,
                    recorder.ranks,
                    algo.membership.original_ranks,
                )
        if run.latest is not None and run.latest.left:
            _record_relaunch(run, start, clock_offset)
        last = clock_offset  # step_time: between consecutive ends of steps, pauses excluded
        # Each step records the bytes sent since the last record: threads of the algorithm (a worker,
        # a progress thread, gossip) send between steps too, and nothing they count is lost.
        bytes_recorded = algo.bytes_sent
        clocks, evaluated = {}, set()
        try:
            ended = False
            while step < total or not ended:
                phase = "between steps"
                try:
                    if step >= total:  # the final evaluation; again where a rank failed during it
                        run.faults.before_step(step)  # a kill planned for after the last step
                        if evaluate:
                            _final_evaluation(run, channels, clock, step, steps_per_epoch, clocks, evaluated)
                        ended = True
                        continue
                    if run.replacements_left and _vacant_rows(run):
                        channels = _take_replacements(run, channels, data, evaluate, stop is not None, clock)
                        last = clock()
                    algo.expect_replacements(run.replacements_left > 0)
                    phase = "step"
                    algo.start_step_timer()  # the rank's work starts here, not at the last step's bookkeeping
                    samples = algo.samples_per_step
                    batch = data.take(step, samples)
                    lr.apply(optimizer, step)
                    c0 = time.perf_counter()
                    slowed = run.faults.before_step(step)  # a stop returns when continued; a kill never
                    loss, injected = compute(step, batch, algo.zero_grad, share=samples / args.batch_size)
                    c1 = time.perf_counter()
                    stale_before, update.seconds = algo.stale_steps, 0.0
                    algo.step()
                    c2 = time.perf_counter()
                    sent = algo.bytes_sent
                    phase = "between steps"
                    now = clock()
                    # Allreduce-SGD waits for its buckets at the end of backward: communication, not compute.
                    in_backward = algo.comm_in_backward_s
                    comm_time = c2 - c1 + in_backward
                    recorder.record(
                        step,
                        step_time=now - last,
                        compute_time=c1 - c0 - in_backward,
                        delay=injected + slowed,
                        comm_time=comm_time,
                        wait_time=max(0.0, comm_time - update.seconds),
                        loss=loss,
                        stale=float(algo.stale_steps > stale_before),
                        clock=now,
                        samples=samples,
                        skipped=0.0,
                        contribution=algo.contribution,
                        bytes_sent=sent - bytes_recorded,
                    )
                    bytes_recorded = sent
                    last = now
                    clocks[step] = now
                    step += 1
                    if algo.skipped:  # ensemble_sync's fast-forward of a late rank
                        _record_skipped(recorder, range(*algo.skipped), now, clocks)
                        data.skip(algo.skipped[1] - step, samples)
                        step = algo.skipped[1]
                    progress.update(
                        step, loss, run.comm.size * args.batch_size * (step - start) / max(now - clock_offset, 1e-9)
                    )
                    if evaluate and step < total and eval_interval and step % eval_interval == 0:
                        _evaluate_now(run, channels, clock, step, steps_per_epoch, clocks, evaluated)
                    stopping = channels.vote is not None and channels.vote.vote(step, stop.requested)
                    # The final checkpoint comes after close(), which can still change the model.
                    if (
                        args.checkpoint_dir
                        and step < total
                        and (stopping or (args.checkpoint_every and step % args.checkpoint_every == 0))
                    ):
                        clock.pause()
                        run.checkpoint(step, clock())
                        clock.resume()
                    if run.comm.rank == 0:
                        recorder.record_tables(algo.sync_tables())
                        for death in algo.deaths_without_shrink():
                            recorder.record_dead_member(
                                step=death["step"],
                                clock=clocks.get(death["step"] - 1, now),
                                rank=death["rank"],
                                noticed="timeout" if death["timed_out"] else "proc_failed",
                                recovery_s=death["waited_s"],
                            )
                    if stopping and step < total:
                        status = "stopped"
                        break
                except BaseException as error:
                    if clock.paused:  # a failure during an evaluation or a checkpoint
                        clock.resume()
                    change, channels = _recover(run, error, phase, channels, data, evaluate, stop is not None, clock)
                    now = clock()
                    if change.step > step:  # steps this rank did not complete, taken by another survivor
                        _record_skipped(recorder, range(step, change.step), now, clocks)
                        data.skip(change.step - step, samples)
                    step, last = change.step, now
        finally:
            progress.close()
            update.remove()
    channels.close()
    return status, clock()


def _recover(run, error, phase, channels, data, evaluate, stop, clock):
    """The survivors' recovery from ``error`` (:func:`~wagma.membership.survive`,
    which raises it again where it is not a rank's failure), then the loop's
    side of it (:func:`_go_on_without`); a rank that fails during the latter
    is recovered from in turn, and every change goes into the run file.
    Returns the last change and the loop's channels."""
    changes = []
    while True:
        changes.append(survive(run.algo, error, phase))
        try:
            return changes[-1], _go_on_without(run, changes, channels, data, evaluate, stop, clock())
        except BaseException as again:
            if mpi_failure(again) is None:
                raise
            logger.warning("another rank failed while the survivors went on: %s", again)
            error, phase = again, "between steps"


def _go_on_without(run, changes, channels, data, evaluate, stop, now):
    """After :func:`~wagma.membership.survive`: the loop's side of the
    membership ``changes`` (one, or more where ranks failed while the
    survivors recorded the first).  The run follows the algorithm onto the survivors'
    communicator, the loop's channels are built there (the old ones are
    revoked, let go without communicating), the run file gets its new writer
    and the changes, and the survivors take over the dead ranks' data."""
    algo = run.algo
    run.world, run.comm = algo.membership.comm, algo.comm
    hold(channels)  # a vote may be in flight on the revoked channel: never freed under it
    channels = _Channels(run, evaluate, stop)
    run.recorder.rebuild(run.world)
    clock = run.comm.control.allreduce(now, op=MPI.MAX)  # one value on every member: one row per change
    for change in changes:
        run.recorder.record_membership(
            step=change.step,
            clock=clock,
            left=change.left,
            noticed="progress_thread" if change.where == "thread" else change.noticed,
            recovery_s=change.recovery_s,
        )
    run.adjustments += [{"step": c.step, "adjustment": a} for c in changes for a in c.adjustments]
    _share_rows_left(run, data)
    return channels


def _take_replacements(run, channels, data, evaluate, stop, clock):
    """The survivors' side of ``--replace``: start a replacement for each
    row that left, up to the run's budget (:func:`wagma.healing.replace`;
    each runs :func:`join_training`), then, with them, build the loop's
    channels on the members' communicator, follow with the run file and
    record the change, and share the rows still vacant.  A refused or late
    attempt ends the replacements for the run: the survivors go on without."""
    algo = run.algo
    count = min(run.replacements_left, _vacant_rows(run))
    try:
        command = None if run.spares else run.command
        change = replace(algo, count, command, spares=run.spares, wait_s=run.args.replace_wait)
    except ValueError as exc:  # found before anything was started, the same on every member
        run.replacements_left = 0
        if run.comm.rank == 0:
            logger.warning("no more replacements: %s", exc)
        return channels
    channels.close()  # the survivors' (collective over them; the newcomers wait in the new ones)
    run.world, run.comm = algo.membership.comm, algo.comm
    run.replacements_left = run.replacements_left - len(change.joined) if not change.refused else 0
    channels = _Channels(run, evaluate, stop)
    if change.joined:
        run.recorder.rebuild(run.world)
    _record_join(run, change, clock())
    if run.comm.rank == 0:
        if change.refused:
            logger.warning(
                "replacements not admitted at step %d (%s): going on with %d ranks, no more replacements",
                change.step,
                ", ".join(change.refused),
                run.comm.size,
            )
        else:
            logger.info(
                "replacements took rows %s at step %d after %.2f s; %d ranks",
                change.joined,
                change.step,
                change.recovery_s,
                run.comm.size,
            )
    _share_rows_left(run, data)
    return channels


def _vacant_rows(run):
    """The rows without a member: those a shrink left, and dead members still in the communicator,
    which ensemble_sync's synchronization names on every member at one step once it waited for them."""
    return run.recorder.ranks - len(run.algo.membership.original_ranks) + run.algo.dead_to_replace


def _record_join(run, change, now):
    """Every member, newcomers included: the change into the run file, at
    rank 0's training clock ``now`` as the members go on (the newcomers pass None and take it,
    the budget of replacements left and the chaos plan's time zero from
    rank 0); returns the clock."""
    now, run.replacements_left, run.chaos_start = run.world.bcast((now, run.replacements_left, run.chaos_start), root=0)
    run.recorder.record_join(step=change.step, clock=now, joined=change.joined, recovery_s=change.recovery_s)
    run.adjustments += [{"step": change.step, "adjustment": a} for a in change.adjustments]
    return now


def _share_rows_left(run, data):
    """The survivors take over the data of the rows that left
    (:meth:`_TrainingData.take_over`), so the global batch stays the same."""
    algo = run.algo
    original = algo.membership.original_ranks
    data.take_over(
        [r for r in range(run.recorder.ranks) if r not in original],
        original.index(algo.membership.original_rank),
        len(original),
    )
    if data.streaming:  # the reallocation keeps the global batch: the budget of the ranks at the start
        algo.plan(run.total, max(1, round(run.args.batch_size * run.recorder.ranks / len(original))))
    else:
        algo.samples_per_step = data.samples_per_step


def _record_relaunch(run, start, clock_offset):
    """A run resumed on the ranks left after ranks died (no fault
    tolerance: the job ended and was started again) records the change:
    step ``start`` (the checkpoint's), the clock it went on from, the rows
    that left, noticed ``relaunch``, and ``recovery_s`` from the death (the
    time ``python -m experiments.checkpoint without --died-at`` was given)
    to now, when every member is ready for its first step.  The record is
    then taken out of ``latest.json``: it is in the run file's logs, which
    a later resume from the same checkpoint keeps."""
    latest = run.latest
    ready = run.comm.control.allreduce(time.time(), op=MPI.MAX)
    for died_at, entries in itertools.groupby(latest.left, key=lambda e: e.get("died_at")):
        run.recorder.record_membership(
            step=start,
            clock=clock_offset,
            left=[e["row"] for e in entries],
            noticed="relaunch",
            recovery_s=ready - died_at if died_at is not None else math.nan,
        )
    run.comm.control.Barrier()  # every member recorded it before the record leaves latest.json
    if run.comm.rank == 0:
        Latest(latest.step, latest.members, latest.rows).write(run.args.checkpoint_dir)


def _record_skipped(recorder, steps, now, clocks):
    """Steps a rank skipped (ensemble_sync's fast-forward): samples 0, no
    times (it did not take them), its clock ``now``, when it rejoined."""
    row = {**dict.fromkeys(STEP_FIELDS, math.nan), "clock": now, "samples": 0.0, "skipped": 1.0}
    for missed in steps:
        recorder.record(missed, **row)
        clocks[missed] = now


def _evaluate_ensemble(algo, evaluator, recorder, steps_per_epoch, clocks, evaluated):
    """ensemble_sync: rank 0 alone scores the ensemble it last took part in
    (the average every member of that round holds), stamped with the step
    that round ended at and rank 0's clock at the end of that step; the
    others go on training (no rank waits for an evaluation).  An ensemble
    already scored (no round closed since) is not scored again."""
    if algo.ensemble is None or algo.ensemble[0] in evaluated:
        return
    step, parameters = algo.ensemble
    evaluated.add(step)
    loss, accuracy = evaluator.of_parameters(parameters)
    recorder.record_eval(step=step, epoch=step / steps_per_epoch, clock=clocks[step - 1], accuracy=accuracy, loss=loss)
    recorder.flush()
    logger.info(
        "step %d epoch %g: ensemble accuracy %.2f %%, loss %.4f", step, step / steps_per_epoch, 100 * accuracy, loss
    )


class _TrainingData:
    """A rank's training batches, by global step.

    Without reallocation, step s takes batch ``s % steps_per_epoch`` of
    epoch ``s // steps_per_epoch`` (:meth:`Dataset.train_batches`), so a
    resumed or fast-forwarded rank finds its place from the step alone.
    With reallocation (``streaming``) the batch sizes change from period to
    period and the rank reads its sample stream instead
    (:meth:`Dataset.stream_batch`), from a position that counts the samples
    it has taken or skipped (a resumed run starts the stream at the step's
    place as if every step had had ``--batch-size`` samples).  Emulated
    compute (``needed`` False) reads no data.

    After ranks die (:meth:`take_over`), each survivor also reads a slice of
    every dead rank's batch at each step, so the global batch stays the
    same and no sample is read twice in an epoch; with reallocation the
    shares already keep the global batch, and each survivor reads further
    into its own stream (the dead ranks' shards are then not read).
    """

    def __init__(self, dataset, batch_size, steps_per_epoch, start, streaming, needed):
        self.dataset, self.batch_size, self.steps_per_epoch = dataset, batch_size, steps_per_epoch
        self.streaming, self.needed = streaming, needed
        self.position = start * batch_size
        self._batches, self._next = None, None
        #: ``(shard, lo, hi)``: this rank's batch, then its slices of the dead ranks'.
        self.parts = [(dataset.rank, 0, batch_size)]

    @property
    def samples_per_step(self):
        """The samples of one step without reallocation: this rank's batch and its slices."""
        return sum(hi - lo for _, lo, hi in self.parts)

    def take_over(self, dead, member, members):
        """Read, at every step from now on, slice ``member`` of ``members``
        of each of the ``dead`` shards' batches (ranks of the job's start):
        slice j of a batch of b samples is ``[j b // m, (j + 1) b // m)``, so
        the m survivors' slices cut it into disjoint parts that cover it."""
        b = self.batch_size
        self.parts = [(self.dataset.rank, 0, b)] + [
            (shard, member * b // members, (member + 1) * b // members) for shard in dead
        ]
        self._next = None

    def take(self, step, count):
        if not self.needed:
            return None
        if self.streaming:
            batch = self.dataset.stream_batch(self.position, count)
            self.position += count
            return batch
        if len(self.parts) > 1:
            epoch, index = divmod(step, self.steps_per_epoch)
            return self.dataset.batch_of_shards(self.parts, epoch, index, self.batch_size)
        if self._next != step:
            epoch, index = divmod(step, self.steps_per_epoch)
            self._batches = self.dataset.train_batches(epoch, self.batch_size, start=index)
        self._next = step + 1 if (step + 1) % self.steps_per_epoch else None
        return next(self._batches)

    def skip(self, steps, count):
        """Pass over ``steps`` steps of ``count`` samples (a fast-forward)."""
        self.position += steps * count


def _final_evaluation(run, channels, clock, step, steps_per_epoch, clocks, evaluated):
    """:func:`_evaluate_now` after the last step, ended, where the
    evaluation is collective, by an agreement
    (:func:`~collectives.failures.every_one_done`): where a rank failed
    during it, every member raises the failure, recovers, and evaluates
    again; without the agreement a member whose last collective of the
    evaluation completed would have left the others to recover without it.
    A row recorded before the failure stays: the file then has two at the
    last step, the second the survivors'."""
    failure = None
    try:
        _evaluate_now(run, channels, clock, step, steps_per_epoch, clocks, evaluated)
    except BaseException as error:
        failure = mpi_failure(error)
        if failure is None:
            raise
        revoke_tracked()  # a member blocked on one that failed is released
    # ensemble_sync's rank 0 scores alone, and its members go on past dead ranks without a shrink: an
    # agreement over them would fail on the dead and shrink a run that needs none.
    collective = not run.algo.evaluates_ensemble
    if collective and fault_tolerant() and not every_one_done(run.comm.control, failure is None):
        raise failure or MPI.Exception(MPI.ERR_PROC_FAILED)


def _evaluate_now(run, channels, clock, step, steps_per_epoch, clocks, evaluated):
    """The evaluation after ``step`` steps, the training clock paused: the
    averaged model's (:func:`_evaluate`), or ensemble_sync's ensemble."""
    clock.pause()
    if run.algo.evaluates_ensemble:
        _evaluate_ensemble(run.algo, channels.evaluator, run.recorder, steps_per_epoch, clocks, evaluated)
    else:
        now = clocks.get(step - 1, clock())
        _evaluate(run.args, channels.evaluator, run.recorder, step, step / steps_per_epoch, now, run.comm)
    clock.resume()


def _evaluate(args, evaluator, recorder, step, epoch, step_clock, comm):
    """Scores the averaged model after ``step`` steps and records it, stamped
    with the slowest rank's clock at the end of that step (``step_clock`` is
    this rank's; see :class:`~wagma.clock.TrainingClock`)."""
    loss, accuracy = evaluator.averaged()
    replicas = None
    if args.eval_replicas:
        replicas = np.array(comm.control.allgather(evaluator.replica()))
    latest = comm.control.allreduce(step_clock, op=MPI.MAX)
    recorder.record_eval(step=step, epoch=epoch, clock=latest, accuracy=accuracy, loss=loss, replica_accuracy=replicas)
    recorder.flush()
    if comm.rank == 0:
        logger.info("step %d epoch %g: averaged model accuracy %.2f %%, loss %.4f", step, epoch, 100 * accuracy, loss)
