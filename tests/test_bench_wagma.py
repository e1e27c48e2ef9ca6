"""``python -m collectives.bench wagma`` end to end: a real 2-rank job and its HDF5 file."""

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import h5py
import numpy as np
import pytest
from launcher import mpiexec, mpiexec_command

from collectives.bench.wagma import ratio_spread, round_order
from collectives.provenance import tuning_environment

ROOT = Path(__file__).resolve().parent.parent
IMPLEMENTATIONS = ["wait_avoiding", "group_blocking", "global_allreduce"]

pytestmark = [pytest.mark.launcher, pytest.mark.skipif(mpiexec() is None, reason="no mpiexec found")]


def _bench(*args, env=None):
    return subprocess.run(
        [*mpiexec_command(2), sys.executable, "-m", "mpi4py", "-m", "collectives.bench", "wagma", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@pytest.mark.timing  # delayed steps by sleeps, CPU time against wall time
def test_the_file_holds_every_step_of_every_implementation_in_interleaved_rounds(tmp_path, record_measurement):
    out = tmp_path / "wagma.h5"
    job = _bench(
        "--size-mib",
        "0.25",
        "--iterations",
        "7",
        "--rounds",
        "3",
        "--warmup",
        "1",
        "--delay-ms",
        "2",
        "--idle-seconds",
        "0.1",
        "--out",
        str(out),
    )
    assert job.returncode == 0, job.stdout + job.stderr
    assert "WA/blocking" in job.stdout and "idle progress thread" in job.stdout
    assert "round by round" in job.stdout and "CPU ms per rank and step" in job.stdout
    with h5py.File(out) as f:
        assert f.attrs["implementations"].split(",") == IMPLEMENTATIONS
        assert (f.attrs["ranks"], f.attrs["rounds"], f.attrs["warmup_per_round"]) == (2, 3, 1)
        # Rounds of 2, 3 and 2 steps, the first step of each left out.
        kept = f["kept_steps"][:]
        assert kept.tolist() == [False, True, False, True, True, False, True]
        order = f["round_order"][:]
        assert order.tolist() == [[0, 1, 2], [1, 2, 0], [2, 0, 1]]
        for scenario in ("none", "random2", "straggler"):
            group = f[scenario]
            delayed = group["delayed"][:]
            assert delayed.shape == (7, 2)
            assert delayed.sum(axis=1).tolist() == {"none": [0] * 7, "random2": [2] * 7, "straggler": [1] * 7}[scenario]
            for implementation in IMPLEMENTATIONS:
                seconds = group[implementation][:]
                assert seconds.shape == (2, 7) and (seconds > 0).all()
                # A delayed step lasts at least the delay, which it sleeps
                # through without using the CPU.
                assert (seconds.T[delayed] >= 2e-3).all()
                process = group[f"{implementation}_process_cpu"][:]
                main_thread = group[f"{implementation}_main_thread_cpu"][:]
                assert process.shape == main_thread.shape == (2, 7)
                assert (process >= 0).all() and (main_thread >= 0).all()
                record_measurement(
                    f"{scenario} {implementation}: process CPU / wall time of a delayed step",
                    (process.T[delayed] / seconds.T[delayed]).max(initial=0.0),
                    1.0,
                )
                assert (process.T[delayed] < seconds.T[delayed]).all()
                assert group[f"{implementation}_process_cpu"].attrs["ms_per_step"] == pytest.approx(
                    process[:, kept].mean() * 1e3
                )
            assert group["wait_avoiding_fresh"].shape == (2, 7)
            # Per round, over the same kept steps: 1, 2 and 1 of them (no
            # rank delayed), so their weighted mean is the overall figure.
            if scenario == "none":
                for implementation in IMPLEMENTATIONS:
                    attrs = group[implementation].attrs
                    rounds = attrs["fast_rank_ms_per_round"]
                    assert rounds.shape == (3,)
                    assert np.average(rounds, weights=[1, 2, 1]) == pytest.approx(attrs["fast_rank_ms_per_iteration"])
        assert np.isnan(f["random2/wait_avoiding"].attrs["fast_rank_ms_per_round"]).all()
        fast = f["straggler/wait_avoiding"].attrs["fast_rank_ms_per_iteration"]
        assert np.isfinite(fast) and fast > 0
        assert np.isnan(f["random2/wait_avoiding"].attrs["fast_rank_ms_per_iteration"])
        assert f["idle_progress_cpu_fraction"].shape == (2,)


def test_a_pair_alone_runs_and_is_stored_without_the_third(tmp_path):
    out = tmp_path / "pair.h5"
    job = _bench(
        "--size-mib",
        "0.25",
        "--iterations",
        "8",
        "--rounds",
        "4",
        "--warmup",
        "1",
        "--scenarios",
        "none",
        "--implementations",
        "group_blocking,group_library",
        "--group-algorithm",
        "recursive_doubling",
        "--idle-seconds",
        "0.1",
        "--out",
        str(out),
        env={**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"},
    )
    assert job.returncode == 0, job.stdout + job.stderr
    # Only the ratio of the pair: ours (the butterfly asked for) over the library's.
    assert "blocking/library" in job.stdout and "WA/" not in job.stdout and "global/WA" not in job.stdout
    with h5py.File(out) as f:
        assert f.attrs["implementations"] == "group_blocking,group_library"
        assert f.attrs["group_algorithm"] == "recursive_doubling"
        assert "MALLOC_MMAP_THRESHOLD_=131072" in f.attrs["tuning_environment"].split(";")
        assert f["round_order"][:].tolist() == [[0, 1], [1, 0], [1, 0], [0, 1]]
        assert sorted(f["none"]) == sorted(
            [
                "delayed",
                "group_blocking",
                "group_library",
                "group_blocking_process_cpu",
                "group_blocking_main_thread_cpu",
                "group_library_process_cpu",
                "group_library_main_thread_cpu",
            ]
        )
        assert f["none/group_blocking"].shape == (2, 8)


def test_the_persistent_group_allreduce_runs_beside_the_librarys_call(tmp_path):
    out = tmp_path / "persistent.h5"
    job = _bench(
        *("--size-mib", "0.0625", "--iterations", "8", "--rounds", "2", "--warmup", "1"),
        *("--scenarios", "none", "--implementations", "group_persistent,group_library"),
        *("--group-algorithm", "mpi", "--idle-seconds", "0.1", "--out", str(out)),
    )
    assert job.returncode == 0, job.stdout + job.stderr
    assert "persistent/library" in job.stdout and "blocking/library" not in job.stdout
    with h5py.File(out) as f:
        assert f.attrs["implementations"] == "group_persistent,group_library"
        assert f.attrs["group_algorithm"] == "mpi"
        seconds = f["none/group_persistent"][()]
        assert seconds.shape == (2, 8) and np.all(seconds[:, 1:] > 0)


@pytest.mark.parametrize(
    "args, words",
    [
        (["--rounds", "9", "--iterations", "6"], "--rounds must be in 1..--iterations (6)"),
        (["--iterations", "6", "--rounds", "3", "--warmup", "2"], "--warmup must be in 0..1"),
        (["--scenarios", "none,slow"], "--scenarios must be from none, random2, straggler"),
        (
            ["--implementations", "wait_avoiding,wait_avoiding"],
            "--implementations must be distinct names from wait_avoiding, group_blocking, global_allreduce, "
            "group_library, group_persistent",
        ),
        (["--implementations", "ring"], "--implementations must be distinct names"),
    ],
)
def test_bad_arguments_name_the_parameter_and_nothing_is_written(tmp_path, args, words):
    out = tmp_path / "wagma.h5"
    job = _bench(*args, "--out", str(out))
    assert job.returncode != 0
    assert words in job.stderr
    assert not out.exists()


def test_ratio_spread_is_over_the_rounds_where_both_were_measured():
    wa = np.array([2.0, 3.0, np.nan, 4.0])
    blocking = np.array([1.0, 2.0, 1.0, 4.0])
    assert ratio_spread(wa, blocking) == (1.5, 1.0, 2.0)
    assert all(np.isnan(ratio_spread(np.full(2, np.nan), np.ones(2))))


def test_any_number_of_implementations_is_balanced_over_twice_as_many_rounds():
    # The default, all three over the default 6 rounds, among them.
    assert round_order(0) == round_order(0, IMPLEMENTATIONS)
    for implementations in (IMPLEMENTATIONS[:1], IMPLEMENTATIONS[1:], IMPLEMENTATIONS):
        n = len(implementations)
        orders = [round_order(r, implementations) for r in range(2 * n)]
        assert all(sorted(order) == sorted(implementations) for order in orders)
        firsts = Counter(order[0] for order in orders)
        follows = Counter(pair for order in orders for pair in zip(order, order[1:]))
        assert set(firsts.values()) == {2} and len(firsts) == n
        # Each ordered pair follows twice (none at all with one implementation).
        assert len(follows) == n * (n - 1) and set(follows.values()) <= {2}
        assert sum(follows.values()) == 2 * n * (n - 1)


def test_the_tuning_environment_names_only_the_variables_that_tune():
    environ = {
        "MALLOC_ARENA_MAX": "2",
        "HOME": "/root",
        "MPIR_CVAR_CH4_SHM": "1",
        "PATH": "/bin",
        "OMP_NUM_THREADS": "1",
    }
    assert tuning_environment(environ) == ("MALLOC_ARENA_MAX=2;MPIR_CVAR_CH4_SHM=1;OMP_NUM_THREADS=1")
    assert tuning_environment({"HOME": "/root"}) == ""
