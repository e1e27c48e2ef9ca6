"""``experiments.campaign main`` as a user runs it: its own fresh folder, commands that paste, nothing else touched."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from launcher import mpiexec, mpiexec_command
from straggler_log import replayed_predictions

from experiments.jobs import run_training
from experiments.mpirun import find_mpiexec, launcher_library
from experiments.options import build_parser
from wagma.results import load_run

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.driver
@pytest.mark.timing
@pytest.mark.timeout(360)  # as its job's: 23 s alone, 51 s beside a 4-rank ResNet-20 job, on 2 cores
@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec next to this Python or on PATH")
def test_main_campaign_writes_a_fresh_folder_under_runs_and_prints_pasteable_commands(tmp_path):
    """Run from an empty working directory, as a fresh clone's `make main` would
    be: everything it writes lands in runs/main-TIMESTAMP (git-ignored) there, and
    each job's printed command line names an existing launcher and interpreter and
    parses back to the options the job ran with."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPIEXEC": mpiexec()}
    job = subprocess.run(
        [sys.executable, "-m", "experiments.campaign", "main", "--ranks", "2", "--epochs", "1", "--algos", "local_sgd"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=330,
    )
    assert job.returncode == 0, job.stderr
    (out_dir,) = (tmp_path / "runs").iterdir()
    assert out_dir.name.startswith("main-")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]  # nothing outside runs/
    written = sorted(p.name for p in out_dir.iterdir())
    assert written == [
        "accuracy_vs_time.png",
        "local_sgd_p2.h5",
        "table.md",
        "throughput.png",
        "waits_local_sgd_p2.png",
    ], written
    assert load_run(str(out_dir / "local_sgd_p2.h5")).attrs["status"] == "complete"
    assert job.stdout.rstrip().endswith(f"to {os.path.join('runs', out_dir.name)}")
    (shown,) = [line[2:] for line in job.stdout.splitlines() if line.startswith("$ ")]
    words = shlex.split(shown)
    launch = mpiexec_command(2)  # with the flags its library needs
    assert words[: len(launch)] == launch and os.access(words[0], os.X_OK)
    words = words[len(launch) :]
    assert words[0] == sys.executable and words[1:3] == ["-m", "experiments.train"]
    args = build_parser().parse_args(words[3:])
    assert (args.algo, args.epochs, args.out) == ("local_sgd", 1, os.path.join("runs", out_dir.name, "local_sgd_p2.h5"))


@pytest.mark.launcher
@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec next to this Python or on PATH")
def test_ensemblesync_campaign_leaves_out_the_kill_runs_where_the_launcher_has_no_fault_tolerance():
    """Under MPICH the campaign runs none, stop and slow and says why not kill;
    under Open MPI (ULFM) nothing is refused (the campaign test below runs it)."""
    from experiments.campaign import kill_runs_refused

    refused = kill_runs_refused(mpiexec())
    if launcher_library(mpiexec()) == "openmpi":
        assert refused is None
    else:
        assert refused.startswith("they need a launcher with fault tolerance (Open MPI's ULFM")
        assert refused.endswith(f"is {launcher_library(mpiexec())}'s")


@pytest.mark.launcher
@pytest.mark.timing
@pytest.mark.timeout(480)  # four jobs: 53-96 s under Open MPI, 209 s beside a 4-rank ResNet-20 job
@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec next to this Python or on PATH")
@pytest.mark.skipif(
    mpiexec() is not None and launcher_library(mpiexec()) != "openmpi",
    reason="runs under Open MPI (make test-mpi MPI=openmpi), whose ULFM adds the kill run to the others",
)
def test_ensemblesync_campaign_tabulates_what_each_fault_cost_from_the_run_files(tmp_path, record_measurement):
    """ensemble_sync alone, 3 epochs: the fault-free, stopped, slow and
    killed runs, the table's rows from their files, the figures."""
    from wagma.analysis.outages import outage_row

    command = [
        sys.executable,
        "-m",
        "experiments.campaign",
        "ensemblesync",
        "--epochs",
        "3",
        "--algos",
        "ensemble_sync",
        "--outage-s",
        "2",
        "--timeout-s",
        "0.5",
        "--out-dir",
        str(tmp_path),
    ]
    try:
        job = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=420)
    except subprocess.TimeoutExpired as late:  # say which job hung: the campaign prints each as it goes
        so_far = b"".join(part or b"" for part in (late.stdout, late.stderr))  # bytes, whatever text=
        pytest.fail(f"the campaign ran past 420 s; its output so far:\n{so_far.decode(errors='replace')}")
    assert job.returncode == 0, job.stderr
    faults = ["none", "stop", "slow", "kill"]
    figures = [f"time_vs_epoch_{f}.png" for f in faults if f != "none"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["allocation.png", "table.md", *figures, *(f"ensemble_sync_{f}.h5" for f in faults)]
    )
    table = (tmp_path / "table.md").read_text().splitlines()[2:]
    assert len(table) == len(faults)
    free = load_run(str(tmp_path / "ensemble_sync_none.h5"))
    for fault, line in zip(faults, table):
        row = outage_row(load_run(str(tmp_path / f"ensemble_sync_{fault}.h5")), fault, free)
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[:3] == [fault, "ensemble_sync", "complete"]
        assert float(cells[4]) == pytest.approx(row["train_time_s"], abs=0.005)
        assert float(cells[5]) == pytest.approx(row["others_longest_wait_s"], abs=0.005)
    stop = outage_row(load_run(str(tmp_path / "ensemble_sync_stop.h5")), "stop", free)
    # The others stood still for one timeout (0.5 s), not the 2 s outage: the
    # longest step less the median step, so give or take a step's spread (50 ms).
    record_measurement("others' longest wait in the stop run, s", stop["others_longest_wait_s"], 1.5)
    record_measurement(
        "others' longest wait in the stop run, s (low side)", stop["others_longest_wait_s"], 0.45, above=True
    )
    assert 0.45 <= stop["others_longest_wait_s"] < 1.5 and stop["skipped_steps"] > 0


@pytest.mark.driver
@pytest.mark.timing
@pytest.mark.timeout(300)  # as its job's: 18-33 s alone, 80 s beside a 4-rank ResNet-20 job, on 2 cores
@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec next to this Python or on PATH")
def test_stragglersync_campaign_tabulates_both_syncs_from_the_run_files(tmp_path):
    """local SGD (tau 2) on 4 ranks with a persistent straggler: one run per
    sync, the table's throughput and the predictor's columns from the files."""
    from wagma.results import summarize

    command = [
        sys.executable,
        "-m",
        "experiments.campaign",
        "stragglersync",
        "--ranks",
        "4",
        "--steps",
        "16",
        "--skip-steps",
        "2",
        "--model",
        "mlp",
        "--compute-ms",
        "5",
        "--delay-ms",
        "30",
        "--algos",
        "local_sgd:2",
        "--imbalances",
        "persistent",
        "--repeats",
        "1",
        "--out-dir",
        str(tmp_path),
    ]
    job = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=270)
    assert job.returncode == 0, job.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "local_sgd_tau2_persistent_allreduce.h5",
        "local_sgd_tau2_persistent_stragglar.h5",
        "table.md",
    ]
    line = (tmp_path / "table.md").read_text().splitlines()[4]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[:2] == ["persistent", "local_sgd (tau 2)"]
    base, ours = (
        summarize(load_run(str(tmp_path / f"local_sgd_tau2_persistent_{s}.h5")), skip=2)
        for s in ("allreduce", "stragglar")
    )
    assert float(cells[2]) == pytest.approx(base["throughput"], abs=0.5)
    assert float(cells[3]) == pytest.approx(ours["throughput"], abs=0.5)
    # 8 syncs, the last rank 2 x 30 ms late at each.  What the timing cannot
    # change: each sync ran as the predictor's rule planned it from the
    # arrivals it saw (the file's log, replayed), none before the 4th
    # (collectives.stragglar.prediction), and the hit rate is the log's.
    # What it decides, the prediction itself, must come at least once, at a
    # margin of 60 ms a sync against the scheduler's delays of another rank.
    log = load_run(str(tmp_path / "local_sgd_tau2_persistent_stragglar.h5")).tables["stragglers"]
    np.testing.assert_array_equal(log[:, 1], replayed_predictions(log, 4))
    assert 1 / 8 <= ours["stragglar_fraction"] <= 5 / 8
    predicted = log[:, 1] >= 0
    assert ours["straggler_hit_rate"] == np.mean(log[predicted, 1] == log[predicted, 2])
    assert cells[5] == f"{100 * ours['stragglar_fraction']:.0f} %"
    assert cells[6] == f"{100 * ours['straggler_hit_rate']:.0f} %"
    assert "stragglar_fraction" not in base


def test_variants_name_their_runs_and_flags_and_bad_ones_stop_before_any_job():
    from experiments.campaign import MAIN_VARIANTS, parse_variants

    variants = parse_variants(",".join(MAIN_VARIANTS), 8)
    assert [name for name, _, _ in variants] == [
        "allreduce_sgd",
        "local_sgd",
        "wagma",
        "dpsgd",
        "adpsgd",
        "sgp_peers1",
        "sgp_peers2",
        "eager_sgd",
        "local_sgd_period10",
    ]
    assert variants[-1] == ("local_sgd_period10", "local_sgd", ["--period", "10"])
    for bad, message in (
        (
            "sgp:peers=4",
            "'sgp:peers=4' on 8 ranks: --algo sgp: --peers must be an int from 1 to max(2, ceil(log2 P)) = 3",
        ),
        ("foo", "unknown algorithm 'foo'"),
        ("wagma:nope=1", "--nope 1 is not an option"),
        ("sgp:peers", "argument --peers: expected one argument"),
        ("", "nothing given"),
    ):
        with pytest.raises(ValueError, match=re.escape(message)):
            parse_variants(bad, 8)
    with pytest.raises(ValueError, match="on 4 ranks"):  # a group of 5 fits 6 ranks, not 4
        parse_variants("wagma:group-size=5", [6, 4])


@pytest.mark.driver
@pytest.mark.timeout(240)  # two 1-epoch jobs of 2 ranks: 17 s alone on 2 cores
@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec next to this Python or on PATH")
def test_seeds_campaign_runs_every_seed_and_tabulates_the_spread(tmp_path):
    """Each variant once per seed (and repeat), each run with its own seed;
    the table's range and mean are those of the run files' accuracies."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPIEXEC": mpiexec()}
    job = subprocess.run(
        [
            sys.executable,
            "-m",
            "experiments.campaign",
            "seeds",
            "--epochs",
            "1",
            "--seeds",
            "3,4",
            "--repeats",
            "1",
            "--eval-every",
            "0.5",
            "--algos",
            "local_sgd",
            "--out-dir",
            "out",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=220,
    )
    assert job.returncode == 0, job.stderr
    files = [tmp_path / "out" / f"local_sgd_p2_seed{seed}_run1.h5" for seed in (3, 4)]
    runs = [load_run(str(f)) for f in files]
    assert [r.attrs["seed"] for r in runs] == [3, 4]
    final = [100 * r.summary["final_accuracy"] for r in runs]
    last = [100 * r.summary["last_epoch_accuracy"] for r in runs]
    assert all(len(r.eval["accuracy"]) == 2 for r in runs)  # two evaluations in the one epoch
    table = (tmp_path / "out" / "table.md").read_text()
    row = (
        f"| local_sgd | 2 | 2 | {min(final):.1f}-{max(final):.1f} | {np.mean(final):.1f} | "
        f"{min(last):.1f}-{max(last):.1f} | {np.mean(last):.1f} | 0.00 |"
    )
    assert row in table, table


@pytest.mark.driver
@pytest.mark.timeout(240)  # two 1-epoch jobs of 2 ranks
@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec next to this Python or on PATH")
def test_diloco_campaign_tabulates_accuracy_and_the_bytes_each_rank_sent(tmp_path):
    """The main job's task with DiLoCo and with int8 on its wire: a row per
    variant whose accuracy and bytes are the run files'; int8's bytes are
    0.254 of float32's (a byte per value and a scale per 256)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPIEXEC": mpiexec()}
    command = [sys.executable, "-m", "experiments.campaign", "diloco", "--ranks", "2", "--epochs", "1"]
    command += ["--tasks", "main", "--algos", "diloco:period=2,diloco:period=2:compression=int8", "--out-dir", "out"]
    job = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=220)
    assert job.returncode == 0, job.stderr
    plain, int8 = (
        load_run(str(tmp_path / "out" / "main" / f"{n}_p2_seed0.h5"))
        for n in ("diloco_period2", "diloco_period2_compressionint8")
    )
    sent = [r.summary["bytes_sent_per_rank"] for r in (plain, int8)]
    assert sent[1] / sent[0] == pytest.approx(0.254, abs=0.002)
    table = (tmp_path / "out" / "main" / "table.md").read_text()
    for label, run in (("diloco", plain), ("diloco (int8)", int8)):
        accuracy = 100 * run.summary["last_epoch_accuracy"]
        assert f"| {label} | 1 | {accuracy:.1f} |" in table, table
        assert f"| {run.summary['bytes_sent_per_rank'] / 1e6:.2f} |" in table, table
    assert not (tmp_path / "out" / "accuracy").exists()  # --tasks main: the accuracy task not run


def test_seeds_campaign_refuses_bad_seeds_and_repeats(capsys):
    from experiments.campaign import main

    for argv, words in (
        (["--seeds", "1,x"], "expected comma-separated non-negative integers, got '1,x'"),
        (["--repeats", "0"], "--repeats must be >= 1, got 0"),
        (["--algos", "eager_sgd:late=keep"], "--late must be one of 'drop', 'newest', 'accumulate'"),
    ):
        with pytest.raises(SystemExit):
            main(["seeds", *argv])
        assert words in capsys.readouterr().err


def test_chaos_campaign_refuses_bad_options_before_any_job(capsys):
    from experiments.campaign import main

    for argv, words in (
        (["--mtbf", "0"], "--mtbf must be > 0 seconds, got 0.0"),
        (["--keep", "8"], "--keep must be from 1 to --ranks - 1 (7), got 8"),
        (["--spares", "0"], "--spares must be >= 1, got 0"),
        (["--long-failures", "100", "--long-seeds", "3,4,3"], "--long-seeds: three different seeds at least"),
        (
            ["--long-failures", "100", "--long-mtbf", "3", "--long-landing", "0.75", "--long-recovery-s", "4"],
            "--long-mtbf 3 leaves no time to train when --long-landing 0.75 of the failures land",
        ),
        (["--long-failures", "100", "--long-landing", "0"], "--long-landing must be in (0, 1], got 0.0"),
        (["--algos", "wagma,nope"], "--algos: unknown nope"),
    ):
        with pytest.raises(SystemExit):
            main(["chaos", *argv])
        assert words in capsys.readouterr().err


def test_the_long_run_trains_for_the_time_its_failures_leave():
    """130 failures (100 and the margin) 8 s apart of which half land take
    2080 s to come; 130 * 4 s go to recovering from them, 1560 s to
    training: 52 000 steps of 30 ms."""
    from experiments.chaos_campaign import long_steps

    assert long_steps(100, 8.0, 0.5, 4.0, 0.03) == 52000
    assert long_steps(10, 8.0, 1.0, 0.0, 1.0) == 104  # every failure lands and costs nothing: 1.3 * 10 * 8 s train
    with pytest.raises(ValueError, match="the mtbf must exceed 3"):
        long_steps(100, 3.0, 0.75, 4.0, 0.03)


@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec next to this Python or on PATH")
def test_a_campaigns_job_past_its_deadline_is_killed_with_every_rank(tmp_path, capsys):
    """Rank 1 stops at step 2 for 10 minutes (SIGSTOP, its --fault): the
    job hangs until its 30 s deadline (its start takes 5-10 s here), then
    the launcher and both ranks are killed; the campaign gets status -9, and the run file under its final
    name, marked as killed, with the steps both ranks took."""
    out = tmp_path / "hung.h5"
    args = ["--dataset", "digits", "--model", "mlp", "--max-steps", "50", "--fault", "stop:rank=1,step=2,seconds=600"]
    status = run_training(find_mpiexec(), 2, "allreduce_sgd", str(out), args, may_fail=True, deadline_s=30)
    assert status == -9
    assert "killed, still running after its deadline of 30 s" in capsys.readouterr().out
    left = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(out).encode() in argv and state != "Z":
            left.append(int(entry))
    assert not left, f"processes of the killed job still running: {left}"
    run = load_run(str(out))
    assert run.attrs["status"] == "failed: killed at its deadline" and np.isfinite(run.steps["clock"][1]).sum() == 2
