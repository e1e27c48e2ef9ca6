"""The sbatch scripts on a real one-node Slurm (munge, slurmctld, slurmd started by scripts/local-slurm).

Skipped, with the reason, where Slurm cannot start (not root, packages
missing): `apt-get install slurm-wlm munge` provides them. The jobs run with
the MPI library of this Python (``make test`` MPICH over ``srun --mpi=pmi2``,
``make test-mpi MPI=openmpi`` Open MPI over ``--mpi=pmix``, which needs
Slurm's PMIx plugin to find ``libpmix.so``: ``apt-get install libpmix-dev``
before slurmd starts); skipped, with the reason, where this Slurm cannot start
that library's ranks.
"""

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
from launcher import steps_written

from collectives.mpi_library import mpi_library
from experiments.mpirun import loaded_library, srun_mpi_plugin
from experiments.slurm_jobs import SlurmUnavailable, job_state, local_slurm, submit, wait_for
from wagma.results import load_run, partial_path

ROOT = Path(__file__).resolve().parent.parent
DEADLINE = 200  # seconds for one test's jobs (the longest, the requeue test, takes about 40 s here)

#: A job paced by a straggler (20 ms a step on rank 1), slow enough to be signalled or killed mid-run.
PACED = {
    "ALGO": "local_sgd",
    "MODEL": "mlp",
    "DATASET": "digits",
    "EPOCHS": "100",
    "BATCH_SIZE": "16",
    "IMBALANCE": "straggler:rank=1,ms=20",
}

# Longer than the suite's per-test limit: jobs wait for the node, and a
# requeued one for Slurm's requeue delay (10 s in scripts/local-slurm).
pytestmark = [pytest.mark.slurm, pytest.mark.timeout(DEADLINE + 60)]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    folder = tmp_path_factory.mktemp("slurm")
    try:
        with local_slurm(folder) as env:
            env["PYTHON"] = sys.executable
            plugin = srun_mpi_plugin()
            probe = subprocess.run(
                ["srun", f"--mpi={plugin}", "-n", "1", "true"],
                env=env,
                capture_output=True,
                text=True,
                timeout=DEADLINE,
            )
            if probe.returncode != 0:
                said = probe.stderr.strip()
                pytest.skip(
                    f"this Slurm cannot start {loaded_library()[1]} ranks with srun --mpi={plugin}: "
                    f"{said.splitlines()[-1] if said else probe.returncode}"
                )
            yield folder, env
    except SlurmUnavailable as exc:
        pytest.skip(str(exc))


def _sbatch(env, settings, script, *options, ranks=4):
    """Submit ``script`` (``ranks`` tasks on the node) from the repository
    root with ``settings`` exported; return the job id."""
    try:
        return submit(env, settings, script, *options, ranks=ranks)
    except RuntimeError as exc:
        pytest.fail(str(exc))


def _finished(env, *jobs):
    """Wait until every job has ended; return their final states (scontrol's fields)."""
    try:
        return wait_for(env, jobs, DEADLINE)
    except TimeoutError as exc:
        pytest.fail(str(exc))


# The two ways ranks start in a job (srun with the library's plugin, mpiexec
# inside the allocation) are marked launcher: make test-mpi runs them under
# each MPI library; the other tests exercise the scripts, not the library.
@pytest.mark.launcher
def test_the_image_classification_job_runs_four_ranks_and_writes_its_run_file(slurm):
    folder, env = slurm
    results = folder / "train"
    # The script's defaults (WAGMA-SGD, ResNet-50 on synthetic ImageNet batches), two steps of batch 2.
    settings = {"EPOCHS": "1", "BATCH_SIZE": "2", "TRAIN_ARGS": "--synthetic-size 4", "RESULTS_DIR": str(results)}
    # Polled, not sbatch --wait: that sleeps 2, 8, then 32 s between looks, and a job of 15 s took 42.
    job_id = _sbatch(env, settings, "slurm/train.sbatch", f"--output={folder}/train-%j.out")
    (state,) = _finished(env, job_id)
    log = (folder / f"train-{job_id}.out").read_text()
    assert state["ExitCode"] == "0:0", log
    assert (results / f"wagma_{job_id}.h5").is_file(), f"no run file; {sorted(os.listdir(results))}\n{log}"
    run = load_run(str(results / f"wagma_{job_id}.h5"))
    assert (run.attrs["status"], run.attrs["ranks"], run.attrs["model"], run.attrs["parameters"]) == (
        "complete",
        4,
        "resnet50",
        25_557_032,
    )
    assert (run.attrs["dataset"], run.attrs["group_size"], run.attrs["tau"]) == ("synthetic", 2, 10)
    assert run.attrs["slurm_job_id"] == job_id and run.attrs["hostnames"] == job_state(env, job_id)["NodeList"]
    assert run.attrs["mpi_library"] == mpi_library()[2]  # srun started this Python's library
    assert run.steps["clock"].shape == (4, 2) and np.all(np.isfinite(run.steps["loss"]))


@pytest.mark.timing
def test_a_job_warned_of_its_time_limit_checkpoints_requeues_and_finishes(slurm):
    folder, env = slurm
    results = folder / "requeue"
    job_id = _sbatch(
        env,
        {
            **PACED,
            "TRAIN_ARGS": "--max-steps 600 --stop-check-every 10",
            "RESULTS_DIR": str(results),
        },
        "slurm/train.sbatch",
        f"--output={folder}/requeue-%j.out",
    )
    partial = partial_path(str(results / f"local_sgd_{job_id}.h5"))
    start = time.monotonic()
    while steps_written(partial) < 20:  # signalled mid-run, once it has trained a little
        assert time.monotonic() - start < DEADLINE, f"the job never trained: {job_state(env, job_id)}"
        time.sleep(0.2)
    # What --signal=USR1@120 delivers before the time limit: SIGUSR1 to every rank.
    subprocess.run(["scancel", "--signal=USR1", job_id], env=env, check=True)
    (state,) = _finished(env, job_id)
    log = (folder / f"requeue-{job_id}.out").read_text()
    assert state["JobState"] == "COMPLETED" and state["Restarts"] == "1", log
    assert "requeueing job" in log and "(restart 1, relaunch 0)" in log
    run = load_run(str(results / f"local_sgd_{job_id}.h5"))
    assert run.attrs["status"] == "complete" and len(run.attrs["resumed_at"]) == 1
    assert run.steps["clock"].shape == (4, 600)
    assert np.all(np.diff(run.steps["clock"], axis=1) > 0)


@pytest.mark.launcher
def test_a_rank_killed_without_fault_tolerance_is_relaunched_on_the_ranks_left(slurm):
    """srun ends the step when rank 3 is killed (SIGKILL, by its --fault);
    train-job.sh completes the run file, keeps the failed segment's, and
    relaunches inside the allocation on the 3 ranks left, from the last
    checkpoint, which the run then finishes."""
    folder, env = slurm
    results = folder / "relaunch"
    job = _sbatch(
        env,
        {
            "ALGO": "allreduce_sgd",
            "MODEL": "mlp",
            "DATASET": "digits",
            "EPOCHS": "100",
            "BATCH_SIZE": "16",
            "TRAIN_ARGS": "--max-steps 60 --checkpoint-every 10 --eval-every 0 --fault kill:rank=3,step=25",
            "RESULTS_DIR": str(results),
        },
        "slurm/train.sbatch",
        f"--output={folder}/relaunch-%j.out",
    )
    (state,) = _finished(env, job)
    log = (folder / f"relaunch-{job}.out").read_text()
    assert state["ExitCode"] == "0:0" and state["Restarts"] == "0", log
    assert "ranks 3 died (at " in log, log
    assert "relaunching on the 3 ranks left from the last checkpoint (relaunch 1)" in log
    assert "relaunch 1) on 1 nodes, 3 ranks" in log
    run = load_run(str(results / f"allreduce_sgd_{job}.h5"))
    assert (run.attrs["status"], run.attrs["ranks"], list(run.attrs["resumed_at"])) == ("complete", 4, [20])
    assert run.steps["clock"].shape == (4, 60) and np.isfinite(run.steps["clock"][3]).sum() == 20
    assert run.membership["left"].tolist() == [3] and run.membership["noticed"].tolist() == [5]  # relaunch
    # From the death to the relaunched ranks' first step: srun's teardown, the launch, the set-up.
    assert 0 < run.membership["recovery_s"][0] < DEADLINE
    failed = load_run(str(results / f"allreduce_sgd_{job}.failed-1.h5"), logs=False)
    assert failed.attrs["status"] == "failed: a rank died"
    assert np.isfinite(failed.steps["clock"][3]).sum() == 25  # the dead rank's steps, to its death
    assert not (results / "exits").exists()  # each launch's record of how its ranks ended, read and removed


@pytest.mark.launcher
def test_mpiexec_launches_the_ranks_inside_a_job(slurm):
    folder, env = slurm
    results = folder / "mpiexec"
    job = _sbatch(
        env,
        {
            "LAUNCHER": "mpiexec",
            "ALGO": "allreduce_sgd",
            "MODEL": "mlp",
            "DATASET": "digits",
            "EPOCHS": "1",
            "BATCH_SIZE": "16",
            "TRAIN_ARGS": "--max-steps 10",
            "RESULTS_DIR": str(results),
        },
        "slurm/train.sbatch",
        f"--output={folder}/mpiexec-%j.out",
    )
    (state,) = _finished(env, job)
    assert state["ExitCode"] == "0:0", (folder / f"mpiexec-{job}.out").read_text()
    run = load_run(str(results / f"allreduce_sgd_{job}.h5"))
    assert (run.attrs["status"], run.attrs["ranks"]) == ("complete", 4)
    assert run.attrs["mpi_library"] == mpi_library()[2]
    assert run.steps["clock"].shape == (4, 10)


def test_ensemble_sync_runs_in_a_job_without_checkpoints(slurm):
    """train-job.sh passes ensemble_sync no --checkpoint-dir (it refuses one:
    its ranks are never at one step together) and the job trains."""
    folder, env = slurm
    results = folder / "ensemble"
    job = _sbatch(
        env,
        {
            "ALGO": "ensemble_sync",
            "MODEL": "mlp",
            "DATASET": "digits",
            "EPOCHS": "1",
            "BATCH_SIZE": "16",
            "TRAIN_ARGS": "--max-steps 20 --period 5 --timeout-s 5",
            "RESULTS_DIR": str(results),
        },
        "slurm/train.sbatch",
        f"--output={folder}/ensemble-%j.out",
    )
    (state,) = _finished(env, job)
    assert state["ExitCode"] == "0:0", (folder / f"ensemble-{job}.out").read_text()
    run = load_run(str(results / f"ensemble_sync_{job}.h5"))
    assert (run.attrs["status"], run.attrs["ranks"]) == ("complete", 4)
    assert run.tables["rounds"].shape[0] == 4 and not (results / "checkpoints").exists()


@pytest.mark.launcher
@pytest.mark.timing
@pytest.mark.skipif(loaded_library()[0] != "openmpi", reason="needs Open MPI's ULFM (make test-mpi MPI=openmpi)")
def test_ensemble_sync_survives_a_killed_rank_in_a_job_started_with_fault_tolerance(slurm):
    """LAUNCHER=mpiexec FAULT_TOLERANT=1: experiments.mpirun --fault-tolerant inside the allocation."""
    folder, env = slurm
    results = folder / "ensemble-kill"
    job = _sbatch(
        env,
        {
            "LAUNCHER": "mpiexec",
            "FAULT_TOLERANT": "1",
            "ALGO": "ensemble_sync",
            "MODEL": "mlp",
            "DATASET": "digits",
            "EPOCHS": "1",
            "BATCH_SIZE": "16",
            "TRAIN_ARGS": "--max-steps 40 --period 5 --timeout-s 1 --fault kill:rank=3,step=12",
            "RESULTS_DIR": str(results),
        },
        "slurm/train.sbatch",
        f"--output={folder}/ensemble-kill-%j.out",
    )
    (state,) = _finished(env, job)
    log = (folder / f"ensemble-kill-{job}.out").read_text()
    assert state["ExitCode"] == "0:0", log
    run = load_run(str(results / f"ensemble_sync_{job}.h5"))
    assert run.attrs["status"] == "complete" and json.loads(run.attrs["dead_ranks"]) == [3]
    assert np.all(np.isfinite(run.steps["clock"][:3])) and np.isfinite(run.steps["clock"][3]).sum() == 12


@pytest.mark.launcher
@pytest.mark.timing
@pytest.mark.skipif(loaded_library()[0] != "openmpi", reason="needs Open MPI's ULFM (make test-mpi MPI=openmpi)")
def test_a_spare_task_replaces_a_killed_rank_inside_a_fault_tolerant_job(slurm):
    """SPARES=2 with LAUNCHER=mpiexec FAULT_TOLERANT=1: of the job's 6 tasks,
    4 train and 2 wait as spares (experiments.train --spares 2); rank 3 is
    SIGKILLed at step 12 (its --fault), a spare takes its row at the
    survivors' next step, and the job completes on 4 ranks without a
    relaunch or a requeue."""
    folder, env = slurm
    results = folder / "spares"
    job = _sbatch(
        env,
        {
            "LAUNCHER": "mpiexec",
            "FAULT_TOLERANT": "1",
            "SPARES": "2",
            "ALGO": "allreduce_sgd",
            "MODEL": "mlp",
            "DATASET": "digits",
            "EPOCHS": "100",
            "BATCH_SIZE": "16",
            "TRAIN_ARGS": "--max-steps 40 --eval-every 0 --fault kill:rank=3,step=12",
            "RESULTS_DIR": str(results),
        },
        "slurm/train.sbatch",
        f"--output={folder}/spares-%j.out",
        ranks=6,
    )
    (state,) = _finished(env, job)
    log = (folder / f"spares-{job}.out").read_text()
    assert state["ExitCode"] == "0:0" and state["Restarts"] == "0", log
    assert "on 1 nodes, 4 ranks and 2 spares: " in log and "--spares 2" in log, log
    assert "relaunching" not in log and "requeueing" not in log, log
    run = load_run(str(results / f"allreduce_sgd_{job}.h5"))
    assert (run.attrs["status"], run.attrs["ranks"]) == ("complete", 4)
    changes = run.membership
    assert changes["left"].tolist() == [3, 3] and changes["ranks_after"].tolist() == [3, 4], changes
    # Rank 3's row: the dead rank's 12 steps, then the spare's from the step it joined at to the end.
    joined_at = int(changes["step"][1])
    assert 12 <= joined_at < 40 and np.isfinite(run.steps["clock"][3]).sum() == 12 + 40 - joined_at
    assert np.all(np.isfinite(run.steps["clock"][:3]))


@pytest.mark.launcher
@pytest.mark.timing
def test_a_job_with_spares_that_srun_cannot_start_is_requeued_when_a_rank_dies(slurm):
    """SPARES=1 under srun: 4 of the 5 tasks train (the spare task idles: srun
    ends the step when a rank dies, and nothing joins an ended step); rank 3,
    SIGKILLed mid-run from outside, ends the step, and the job requeues
    itself (Restarts=1) and goes on from its last checkpoint (one every 50
    steps) on all 4 ranks: one run file, complete, every row filled, the
    failed segment's kept."""
    folder, env = slurm
    results = folder / "spares-requeue"
    job = _sbatch(
        env,
        {
            **PACED,
            "SPARES": "1",
            "TRAIN_ARGS": "--max-steps 300 --checkpoint-every 50 --eval-every 0",
            "RESULTS_DIR": str(results),
        },
        "slurm/train.sbatch",
        f"--output={folder}/spares-requeue-%j.out",
        ranks=5,
    )
    partial = partial_path(str(results / f"local_sgd_{job}.h5"))
    start = time.monotonic()
    while steps_written(partial) < 60:  # killed once a checkpoint (step 50) is behind it
        assert time.monotonic() - start < DEADLINE, f"the job never trained: {job_state(env, job)}"
        time.sleep(0.2)
    (victim,) = _ranks_of(f"local_sgd_{job}", rank=3)
    os.kill(victim, signal.SIGKILL)
    (state,) = _finished(env, job)
    log = (folder / f"spares-requeue-{job}.out").read_text()
    assert state["JobState"] == "COMPLETED" and state["Restarts"] == "1", log
    assert "SPARES=1: srun without MPI fault tolerance ends the job's ranks" in log, log
    assert "ranks 3 died (at " in log and "(requeue 1 for dead ranks)" in log, log
    assert "(restart 1, relaunch 0) on 1 nodes, 4 ranks: " in log, log
    run = load_run(str(results / f"local_sgd_{job}.h5"))
    assert (run.attrs["status"], run.attrs["ranks"], len(run.attrs["resumed_at"])) == ("complete", 4, 1)
    assert run.steps["clock"].shape == (4, 300) and np.all(np.isfinite(run.steps["clock"]))
    failed = load_run(str(results / f"local_sgd_{job}.failed-1.h5"), logs=False)
    assert failed.attrs["status"] == "failed: a rank died"
    died = np.isfinite(failed.steps["clock"][3]).sum()
    # Resumed from the last checkpoint every rank saved before the death: at most one interval
    # (50 steps) behind it (the one at the death's own step may be the dead rank's unfinished one).
    assert 60 <= died < 300 and died - 50 <= run.attrs["resumed_at"][0] <= died and run.attrs["resumed_at"][0] % 50 == 0


def _ranks_of(out_name, *, rank):
    """PIDs of the Python ranks (not their record-exit.sh) whose command line
    names ``out_name`` and whose Slurm task is ``rank``."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        python = bool(argv) and Path(argv[0].decode()).name.startswith("python")
        if python and any(out_name.encode() in a for a in argv) and f"SLURM_PROCID={rank}".encode() in environ:
            found.append(int(entry))
    return found


@pytest.mark.launcher
@pytest.mark.skipif(srun_mpi_plugin() != "pmix", reason="makes Slurm's PMIx plugin fail a step's launch")
def test_a_job_whose_ranks_fail_to_launch_fails(slurm):
    """srun exits 0 when its step fails to launch; the job must not.

    The launch fails the way a PMIx directory left behind by a killed step
    makes it fail: the step's directory already exists. That it is looked for
    under the cluster's own folder (scripts/local-slurm's mpi.conf) is what
    keeps one cluster's leftovers from failing another's jobs."""
    folder, env = slurm
    results = folder / "unlaunched"
    job = _sbatch(
        env,
        {
            "ALGO": "allreduce_sgd",
            "MODEL": "mlp",
            "DATASET": "digits",
            "EPOCHS": "1",
            "BATCH_SIZE": "16",
            "TRAIN_ARGS": "--max-steps 10",
            "RESULTS_DIR": str(results),
        },
        "slurm/train.sbatch",
        "--hold",
        f"--output={folder}/unlaunched-%j.out",
    )
    (folder / "pmix" / f"spmix_appdir_{os.getuid()}_{job}.0").mkdir()
    subprocess.run(["scontrol", "release", job], env=env, check=True)
    (state,) = _finished(env, job)
    log = (folder / f"unlaunched-{job}.out").read_text()
    assert (state["JobState"], state["ExitCode"]) == ("FAILED", "1:0"), log
    assert "launch failed" in log
    assert f"launch: the ranks ended without writing {results}/allreduce_sgd_{job}.h5" in log


def test_spares_with_ensemble_sync_under_srun_fail_the_job_before_any_rank_starts(slurm):
    """ensemble_sync has no checkpoint to requeue from: its spares must join a living (ULFM) job."""
    folder, env = slurm
    job = _sbatch(
        env,
        {"ALGO": "ensemble_sync", "SPARES": "1", "RESULTS_DIR": str(folder / "ensemble-spares")},
        "slurm/train.sbatch",
        f"--output={folder}/ensemble-spares-%j.out",
    )
    (state,) = _finished(env, job)
    log = (folder / f"ensemble-spares-{job}.out").read_text()
    assert (state["JobState"], state["ExitCode"]) == ("FAILED", "2:0"), log
    assert "SPARES=1 with ALGO=ensemble_sync needs LAUNCHER=mpiexec FAULT_TOLERANT=1" in log, log
    assert "experiments.train" not in log, log


def test_an_unknown_launcher_fails_the_job_with_a_message(slurm):
    folder, env = slurm
    job = _sbatch(
        env,
        {"LAUNCHER": "aprun", "RESULTS_DIR": str(folder / "bad")},
        "slurm/train.sbatch",
        f"--output={folder}/bad-%j.out",
    )
    (state,) = _finished(env, job)
    log = (folder / f"bad-{job}.out").read_text()
    assert (state["JobState"], state["ExitCode"]) == ("FAILED", "2:0"), log
    assert "LAUNCHER must be srun or mpiexec, got 'aprun'" in log


def test_the_translation_job_trains_a_transformer_with_tau_8(slurm):
    folder, env = slurm
    results = folder / "translate"
    # transformer (small) instead of the script's transformer-base: same task and code path, CPU-sized.
    job = _sbatch(
        env,
        {
            "MODEL": "transformer",
            "EPOCHS": "1",
            "BATCH_SIZE": "8",
            "TRAIN_ARGS": "--max-steps 12",
            "RESULTS_DIR": str(results),
        },
        "slurm/translate.sbatch",
        f"--output={folder}/translate-%j.out",
    )
    (state,) = _finished(env, job)
    assert state["ExitCode"] == "0:0", (folder / f"translate-{job}.out").read_text()
    run = load_run(str(results / f"wagma_{job}.h5"))
    assert (run.attrs["status"], run.attrs["ranks"], run.attrs["model"], run.attrs["dataset"], run.attrs["tau"]) == (
        "complete",
        4,
        "transformer",
        "translation",
        8,
    )
    assert run.steps["clock"].shape == (4, 12) and np.all(np.isfinite(run.steps["loss"]))


def test_the_stragglar_job_benchmarks_every_implementation(slurm):
    folder, env = slurm
    results = folder / "stragglar"
    job = _sbatch(
        env,
        {
            "DELAY_MS": "20",
            "SIZES_MIB": "0.25,1",
            "REPS": "2",
            "BENCH_ARGS": "--sweep-mib 0",
            "RESULTS_DIR": str(results),
        },
        "slurm/stragglar.sbatch",
        f"--output={folder}/stragglar-%j.out",
    )
    (state,) = _finished(env, job)
    assert state["ExitCode"] == "0:0", (folder / f"stragglar-{job}.out").read_text()
    with h5py.File(results / f"stragglar_n4_{job}.h5") as f:
        assert (f.attrs["ranks"], f.attrs["straggler"], f.attrs["slurm_job_id"]) == (4, 3, job)
        names = [name.decode() for name in f["implementations"][()]]
        assert {"stragglar", "broadcast", "ring", "rhd"} <= set(names), names
        assert list(f["sizes_bytes"][()]) == [2**18, 2**20]
        times = f["scan_seconds"][()]  # implementation, size, repetition, (total, after arrival)
        assert times.shape[:3] == (len(names), 2, 2) and np.all(times[..., 0] > 0)


def test_the_figure_10_sweep_submits_one_job_per_algorithm_and_the_analysis_compares_them(slurm):
    folder, env = slurm
    results = folder / "sweep"
    submit = subprocess.run(
        ["slurm/sweep.sh", "10", "1", "wagma,allreduce_sgd", "--", "--time=10", f"--output={folder}/sweep-%j.out"],
        cwd=ROOT,
        env={**env, "STEPS": "4", "RANKS_PER_NODE": "4", "RESULTS_DIR": str(results)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert submit.returncode == 0, submit.stderr
    lines = submit.stdout.split("\n")[:-1]
    assert [line.rsplit(" ", 1)[0] for line in lines] == ["fig10 wagma n=1: job", "fig10 allreduce_sgd n=1: job"]
    jobs = [line.rsplit(" ", 1)[1] for line in lines]
    for job, state in zip(jobs, _finished(env, *jobs)):
        assert state["ExitCode"] == "0:0", (folder / f"sweep-{job}.out").read_text()
        assert state["JobName"].startswith("fig10-")
    for algo, job in zip(["wagma", "allreduce_sgd"], jobs):
        run = load_run(str(results / f"{algo}_{job}.h5"))
        assert (run.attrs["status"], run.attrs["ranks"], run.attrs["compute"]) == ("complete", 4, "emulate")
        assert run.attrs["imbalance"] == "lognormal:median_ms=2000,sigma=1,min_ms=1700,max_ms=43500"
        assert run.steps["delay"].shape == (4, 4) and np.all(run.steps["delay"] >= 1.7)
    table = subprocess.run(
        [sys.executable, "-m", "wagma.analysis", str(results), "--csv", str(folder / "sweep.csv")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert table.returncode == 0, table.stderr
    rows = {row["algorithm"]: row for row in csv.DictReader(open(folder / "sweep.csv"))}
    assert set(rows) == {"wagma", "allreduce_sgd"} and float(rows["allreduce_sgd"]["speedup"]) == 1.0
    assert float(rows["wagma"]["speedup"]) > 0


def test_the_sweep_refuses_an_unknown_figure_before_submitting():
    sweep = subprocess.run(["slurm/sweep.sh", "5"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert sweep.returncode == 2 and sweep.stdout == ""
    assert "FIGURE must be 4, 7 or 10, got '5'" in sweep.stderr
