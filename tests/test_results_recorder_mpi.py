"""RunRecorder under mpiexec: every rank's rows from its log, and a root that changes at rebuild().

A rank "leaves" here by no longer taking part (the others split it off, as
a shrink would), so these run under any MPI library; the same with a rank
killed for real and ULFM's shrink is tests/test_fault_tolerance.py's.
Row values are ``1000 * rank + step`` in every field.
"""

import json
import os

import numpy as np
import pytest
from mpi4py import MPI

from wagma.results import NOTICED, STEP_FIELDS, RunRecorder, load_run, partial_path, rows_path

pytestmark = pytest.mark.mpi

WORLD = MPI.COMM_WORLD
P = WORLD.size
LEAVE_AT, STEPS = 6, 10

needs_two = pytest.mark.skipif(P < 2, reason="a rank must be left when another leaves")


def _record(recorder, step):
    recorder.record(step, **dict.fromkeys(STEP_FIELDS, 1000.0 * WORLD.rank + step))


def _expected(rank, steps):
    return 1000.0 * rank + np.arange(steps)


def test_rows_reach_the_file_from_every_rank_s_log_and_the_logs_go_at_the_end(shared_dir):
    out = os.path.join(shared_dir, "plain.h5")
    recorder = RunRecorder(WORLD, out, {"algorithm": "test", "batch_size": 1}, flush_seconds=3600.0)
    for step in range(STEPS):
        _record(recorder, step)
    recorder.record_eval(step=STEPS, epoch=1.0, clock=1.0, accuracy=0.5, loss=1.0, replica_accuracy=np.arange(P) / P)
    WORLD.Barrier()  # every rank's rows are logged; the root has not flushed (an hour)
    if WORLD.rank == 0:
        assert load_run(partial_path(out), logs=False).steps["clock"].shape == (P, 0)
        assert load_run(partial_path(out)).steps["clock"].shape == (P, STEPS)  # the reader takes the logs'
    WORLD.Barrier()
    path = recorder.close("complete")
    WORLD.Barrier()
    if WORLD.rank:
        assert path is None
        return
    assert path == out and not os.path.exists(partial_path(out)) and not os.path.exists(rows_path(out))
    run = load_run(out)
    for rank in range(P):
        for name in STEP_FIELDS:
            np.testing.assert_array_equal(run.steps[name][rank], _expected(rank, STEPS))
    np.testing.assert_array_equal(run.eval["replica_accuracy"], [np.arange(P) / P])
    assert json.loads(run.attrs["dead_ranks"]) == [] and "membership_changes" not in run.summary


@needs_two
def test_a_new_root_writes_the_file_afresh_from_the_logs_when_the_old_one_left_it_torn(shared_dir):
    """Rank 0 leaves at step LEAVE_AT with its file cut in half (what a
    kill while it wrote would leave); the others rebuild on their own
    communicator, whose rank 0 (world rank 1) writes the file afresh."""
    out = os.path.join(shared_dir, "torn.h5")
    recorder = RunRecorder(WORLD, out, {"algorithm": "test", "batch_size": 1}, flush_seconds=3600.0)
    recorder.record_eval(step=0, epoch=0.0, clock=0.0, accuracy=0.25, loss=2.0)
    for step in range(LEAVE_AT):
        _record(recorder, step)
    recorder.flush()
    WORLD.Barrier()
    if WORLD.rank == 0:
        size = os.path.getsize(partial_path(out))
        os.truncate(partial_path(out), size // 2)
    WORLD.Barrier()
    survivors = WORLD.Split(0 if WORLD.rank else MPI.UNDEFINED, WORLD.rank)
    if WORLD.rank == 0:  # it left: no rebuild, no close
        WORLD.Barrier()
        run = load_run(out)
        np.testing.assert_array_equal(run.steps["clock"][0, :LEAVE_AT], _expected(0, LEAVE_AT))
        assert np.isnan(run.steps["clock"][0, LEAVE_AT:]).all()
        for rank in range(1, P):
            np.testing.assert_array_equal(run.steps["clock"][rank], _expected(rank, STEPS))
        assert json.loads(run.attrs["dead_ranks"]) == [0] and run.attrs["status"] == "complete"
        np.testing.assert_array_equal(run.eval["accuracy"], [0.25, 0.75])  # before and after the change
        assert run.membership["left"].tolist() == [0] and run.membership["ranks_after"].tolist() == [P - 1]
        assert run.membership["noticed"].tolist() == [NOTICED["timeout"]] and run.summary["membership_changes"] == 1
        assert not os.path.exists(rows_path(out))
        return
    recorder.rebuild(survivors)
    assert recorder.members == list(range(1, P))
    with pytest.raises(ValueError, match=r"left must name ranks in \[0, \d+\] that are no longer members"):
        recorder.record_membership(step=LEAVE_AT, clock=1.0, left=[1], noticed="timeout", recovery_s=0.5)
    with pytest.raises(ValueError, match="noticed must be one of proc_failed, revoked, progress_thread, timeout"):
        recorder.record_membership(step=LEAVE_AT, clock=1.0, left=[0], noticed="asleep", recovery_s=0.5)
    recorder.record_membership(step=LEAVE_AT, clock=1.0, left=[0], noticed="timeout", recovery_s=0.5)
    for step in range(LEAVE_AT, STEPS):
        _record(recorder, step)
    recorder.record_eval(step=STEPS, epoch=1.0, clock=2.0, accuracy=0.75, loss=1.0)
    path = recorder.close("complete")
    assert path == (out if survivors.rank == 0 else None)
    survivors.Free()
    WORLD.Barrier()


@needs_two
def test_a_root_that_stays_continues_its_tables_and_maps_replicas_to_their_rows(shared_dir):
    """The last rank leaves; rank 0 stays the root.  The rebuilt algorithm's
    tables restart from no rows: ``t`` (same columns) follows the earlier
    rows, ``u`` (a column per rank) goes to ``u.1``."""
    out = os.path.join(shared_dir, "stays.h5")
    last = P - 1
    recorder = RunRecorder(WORLD, out, {"algorithm": "test", "batch_size": 1}, flush_seconds=3600.0)
    for step in range(LEAVE_AT):
        _record(recorder, step)
    if WORLD.rank == 0:
        recorder.record_tables(
            {"t": (np.ones((2, 2)), ["a", "b"]), "u": (np.ones((1, P)), [f"r{r}" for r in range(P)])}
        )
    survivors = WORLD.Split(0 if WORLD.rank != last else MPI.UNDEFINED, WORLD.rank)
    if WORLD.rank == last:
        WORLD.Barrier()
        run = load_run(out)
        np.testing.assert_array_equal(run.tables["t"], [[1, 1], [1, 1], [2, 2]])
        np.testing.assert_array_equal(run.tables["u"], np.ones((1, P)))
        np.testing.assert_array_equal(run.tables["u.1"], np.full((1, P - 1), 2.0))
        np.testing.assert_array_equal(run.eval["replica_accuracy"], [[*range(1, P), np.nan]])
        np.testing.assert_array_equal(
            run.steps["clock"][last], [*_expected(last, LEAVE_AT), *[np.nan] * (STEPS - LEAVE_AT)]
        )
        assert run.steps["clock"].shape == (P, STEPS) and json.loads(run.attrs["dead_ranks"]) == [last]
        return
    recorder.rebuild(survivors)
    recorder.record_membership(step=LEAVE_AT, clock=1.0, left=[last], noticed="proc_failed", recovery_s=0.5)
    for step in range(LEAVE_AT, STEPS):
        _record(recorder, step)
    # One value per member, in the new communicator's order: rank r scored r + 1.
    recorder.record_eval(step=STEPS, epoch=1.0, clock=2.0, accuracy=0.5, loss=1.0, replica_accuracy=range(1, P))
    if survivors.rank == 0:
        recorder.record_tables(
            {"t": (np.full((1, 2), 2.0), ["a", "b"]), "u": (np.full((1, P - 1), 2.0), ["x"] * (P - 1))}
        )
    recorder.close("complete")
    survivors.Free()
    WORLD.Barrier()


@needs_two
def test_a_member_recorded_dead_without_a_shrink_is_not_recorded_again_when_a_shrink_leaves_it_out(shared_dir):
    """ensemble_sync's coordinator goes on without a dead member (the root
    records it at step LEAVE_AT - 2); a later shrink that leaves it out, with
    another rank, records the other one only: a rank leaves once."""
    out = os.path.join(shared_dir, "dead-then-shrunk.h5")
    last, other = P - 1, P - 2
    recorder = RunRecorder(WORLD, out, {"algorithm": "test", "batch_size": 1}, flush_seconds=3600.0)
    for step in range(LEAVE_AT):
        _record(recorder, step)
    recorder.record_dead_member(step=LEAVE_AT - 2, clock=0.5, rank=last, noticed="proc_failed", recovery_s=0.1)
    gone = {last, other} if other > 0 else {last}
    survivors = WORLD.Split(0 if WORLD.rank not in gone else MPI.UNDEFINED, WORLD.rank)
    if WORLD.rank in gone:
        WORLD.Barrier()
        if WORLD.rank == last:
            m = load_run(out).membership
            expected = [[LEAVE_AT - 2, last], *([[LEAVE_AT, other]] if other > 0 else [])]
            assert [[int(s), int(r)] for s, r in zip(m["step"], m["left"], strict=True)] == expected, m
        return
    recorder.rebuild(survivors)
    recorder.record_membership(step=LEAVE_AT, clock=1.0, left=sorted(gone), noticed="proc_failed", recovery_s=0.5)
    recorder.close("complete")
    survivors.Free()
    WORLD.Barrier()


@needs_two
@pytest.mark.parametrize(
    "made, why",
    [
        (False, r"rank 1 cannot open its row logs in run\.partial\.rows"),
        (True, r"rank 0 does not see the row logs of ranks \[1(, \d+)*\] in run\.partial\.rows"),
    ],
    ids=["no-folder", "other-folder"],
)
def test_a_folder_that_is_not_shared_is_refused_on_every_rank(made, why, shared_dir):
    """Each rank has a folder of its own under the run file's relative name,
    as disks local to each node would give (``made``: the logs' folder is
    there too, so the others can open their logs): rank 0 could never read
    the others' rows, so every rank refuses before recording."""
    mine = os.path.join(shared_dir, f"node-{WORLD.rank}")
    os.makedirs(os.path.join(mine, "run.partial.rows") if made and WORLD.rank else mine)
    here = os.getcwd()
    os.chdir(mine)
    try:
        with pytest.raises(RuntimeError, match=why + r".*: the run file's folder must be one file system every rank"):
            RunRecorder(WORLD, "run.h5", {"algorithm": "test", "batch_size": 1})
    finally:
        os.chdir(here)
