"""wagma.analysis: comparison rows, tables, CSV, figures and the CLI, on run files whose numbers are known."""

import csv
import json
import os
import re
import subprocess
import sys

import h5py
import numpy as np
import pytest

from wagma.analysis import (
    ROW_FIELDS,
    compare,
    format_table,
    mean_throughput,
    plots,
    read_runs,
    run_label,
    to_dataframe,
    write_csv,
)
from wagma.analysis.plots import _binned
from wagma.results import Run, write_run

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH, STEPS = 32, 20


def _write(
    folder,
    name,
    algorithm,
    ranks,
    durations,
    *,
    group_size=0,
    tau=0,
    imbalance="none",
    evals=None,
    status="complete",
    steps_planned=STEPS,
    wait=None,
    stale=None,
    options=None,
    epochs=None,
    sent=None,
):
    """A run file whose latest rank (rank 0) ends step t at sum(durations[:t + 1]);
    ``options``: the algorithm options its config records, as experiments.train's;
    ``sent``: the bytes every rank sent at every step (none recorded: None);
    ``evals``: (clocks, accuracies) at epochs ``epochs`` (default 0, 1, 2, ...)."""
    durations = np.broadcast_to(np.asarray(durations, dtype=float), (STEPS,))
    clock = np.cumsum(durations)[None, :] - 0.001 * np.arange(ranks)[:, None]
    shape = (ranks, STEPS)
    steps = {
        "step_time": np.broadcast_to(durations, shape),
        "compute_time": np.full(shape, 0.1),
        "delay": np.zeros(shape),
        "comm_time": np.full(shape, 0.05),
        "wait_time": np.zeros(shape) if wait is None else wait,
        "loss": np.full(shape, np.nan),
        "stale": np.zeros(shape) if stale is None else stale,
        "clock": clock,
    }
    if sent is not None:
        steps["bytes_sent"] = np.full(shape, sent)
    config = {"algorithm": algorithm, "ranks": ranks}
    if options is not None:
        config["algorithm_options"] = options
    attrs = {
        "config": json.dumps(config),
        "kind": "measured",
        "algorithm": algorithm,
        "ranks": ranks,
        "group_size": group_size,
        "tau": tau,
        "imbalance": imbalance,
        "compute": "emulate",
        "model": "mlp",
        "dataset": "synthetic",
        "batch_size": BATCH,
        "seed": 0,
        "steps_planned": steps_planned,
        "steps_per_epoch": 10,
    }
    if evals is not None:
        clocks, accuracy = (np.asarray(v, dtype=float) for v in evals)
        epoch = np.arange(len(clocks), dtype=float) if epochs is None else np.asarray(epochs, dtype=float)
        evals = {
            "step": np.arange(len(clocks)),
            "epoch": epoch,
            "clock": clocks,
            "accuracy": accuracy,
            "loss": 1 - accuracy,
        }
    path = os.path.join(folder, name)
    write_run(path, attrs, steps, evals, status=status)
    return path


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Eight runs, a file of another schema, a file that is not HDF5 and one that is not .h5."""
    folder = str(tmp_path_factory.mktemp("results"))
    wait = np.broadcast_to(0.01 * np.arange(4)[:, None], (4, STEPS))  # mean 15 ms
    stale = np.zeros((4, STEPS))
    stale[1, ::4] = 1  # 5 of 80
    warmup = [1.0] * 5 + [0.25] * 15  # 5 s, then 3.75 s
    _write(folder, "allreduce_p4.h5", "allreduce_sgd", 4, 0.5, evals=([2.5, 5, 7.5, 10], [0.5, 0.8, 0.91, 0.93]))
    _write(
        folder,
        "wagma_p4.h5",
        "wagma",
        4,
        warmup,
        group_size=2,
        tau=10,
        wait=wait,
        stale=stale,
        evals=([2, 4, 6, 8.75], [0.6, 0.92, 0.88, 0.90]),
        sent=25_000.0,
    )
    _write(folder, "allreduce_p8.h5", "allreduce_sgd", 8, 0.5, evals=([5, 10], [0.3, 0.5]))
    _write(folder, "allreduce_p8_stopped.partial.h5", "allreduce_sgd", 8, 1.0, status="stopped", steps_planned=100)
    _write(folder, "wagma_p8.h5", "wagma", 8, 0.2, group_size=4, tau=10)
    _write(
        folder, "wagma_p8_run2.partial.h5", "wagma", 8, 0.25, group_size=4, tau=10, status="running", steps_planned=100
    )
    _write(folder, "local_p16.h5", "local_sgd", 16, 0.5, tau=10)
    _write(folder, "wagma_p4_random.h5", "wagma", 4, 0.5, group_size=2, tau=10, imbalance="random:k=2,ms=320")
    with h5py.File(os.path.join(folder, "not_a_run.h5"), "w") as f:
        f["x"] = np.arange(3)
        f.attrs["schema"] = "bench/1"
    with open(os.path.join(folder, "garbage.h5"), "wb") as f:
        f.write(b"this is not HDF5 at all\n" * 10)
    with open(os.path.join(folder, "notes.txt"), "w") as f:
        f.write("not a run\n")
    return folder


def _by_file(rows):
    return {os.path.basename(row["file"]): row for row in rows}


def test_read_runs_skips_what_is_not_a_run(results):
    runs, skipped = read_runs(
        [results, os.path.join(results, "missing.h5"), os.path.join(results, "wagma_p8.h5")]
    )  # named twice: read once
    assert len(runs) == 8
    reasons = {os.path.basename(path): reason for path, reason in skipped}
    assert set(reasons) == {"garbage.h5", "not_a_run.h5", "missing.h5"}
    assert reasons["garbage.h5"] == "not an HDF5 file"
    assert "not a run file" in reasons["not_a_run.h5"] and "bench/1" in reasons["not_a_run.h5"]
    assert reasons["missing.h5"] == "no such file or directory"


def test_rows_throughput_speedup_accuracy(results):
    runs, _ = read_runs([results])
    rows = _by_file(compare(runs, baseline="allreduce_sgd", target_accuracy=0.9))
    # samples / time: P * 32 * 20 over the last clock
    expected = {
        "allreduce_p4.h5": (2560 / 10, 1.0),
        "wagma_p4.h5": (2560 / 8.75, 10 / 8.75),
        "allreduce_p8.h5": (5120 / 10, 1.0),
        "allreduce_p8_stopped.partial.h5": (5120 / 20, 0.5),
        "wagma_p8.h5": (5120 / 4, 2.5),
        "wagma_p8_run2.partial.h5": (5120 / 5, 2.0),
        "local_p16.h5": (10240 / 10, None),
        "wagma_p4_random.h5": (2560 / 10, None),
    }
    for name, (throughput, speedup) in expected.items():
        assert rows[name]["throughput"] == pytest.approx(throughput, rel=1e-12), name
        if speedup is None:
            assert rows[name]["speedup"] is None, name
        else:
            assert rows[name]["speedup"] == pytest.approx(speedup, rel=1e-12), name
    assert rows["allreduce_p4.h5"]["time_to_target"] == 7.5
    assert rows["wagma_p4.h5"]["time_to_target"] == 4.0
    assert rows["allreduce_p8.h5"]["time_to_target"] is None
    assert rows["wagma_p8.h5"]["time_to_target"] is None
    assert (rows["wagma_p4.h5"]["final_accuracy"], rows["wagma_p4.h5"]["best_accuracy"]) == (0.90, 0.92)
    allreduce = rows["allreduce_p4.h5"]
    assert (allreduce["final_accuracy"], allreduce["best_accuracy"]) == (0.93, 0.93)
    assert rows["wagma_p8.h5"]["final_accuracy"] is None
    # One evaluation an epoch: the last epoch's mean is the final accuracy.
    assert rows["wagma_p4.h5"]["last_epoch_accuracy"] == 0.90
    assert rows["wagma_p8.h5"]["last_epoch_accuracy"] is None
    assert rows["wagma_p4.h5"]["mean_wait_time"] == pytest.approx(0.015)
    assert rows["wagma_p4.h5"]["stale_fraction"] == pytest.approx(5 / 80)
    assert rows["allreduce_p4.h5"]["stale_fraction"] == 0
    assert rows["wagma_p8.h5"]["status"] == "complete"
    assert rows["wagma_p8_run2.partial.h5"]["status"] == "partial"
    # a later target moves the time
    later = _by_file(compare(runs, target_accuracy=0.925))
    assert later["allreduce_p4.h5"]["time_to_target"] == 10.0
    assert later["wagma_p4.h5"]["time_to_target"] is None
    reached = _by_file(compare(runs, target_accuracy=0.92))  # reaching means >=
    assert reached["wagma_p4.h5"]["time_to_target"] == 4.0


def test_rows_sorted_by_imbalance_compute_ranks_algorithm(results):
    runs, _ = read_runs([results])
    order = [(r["imbalance"], r["ranks"], r["algorithm"], os.path.basename(r["file"])) for r in compare(runs)]
    assert order == [
        ("none", 4, "allreduce_sgd", "allreduce_p4.h5"),
        ("none", 4, "wagma", "wagma_p4.h5"),
        ("none", 8, "allreduce_sgd", "allreduce_p8.h5"),
        ("none", 8, "allreduce_sgd", "allreduce_p8_stopped.partial.h5"),
        ("none", 8, "wagma", "wagma_p8.h5"),
        ("none", 8, "wagma", "wagma_p8_run2.partial.h5"),
        ("none", 16, "local_sgd", "local_p16.h5"),
        ("random:k=2,ms=320", 4, "wagma", "wagma_p4_random.h5"),
    ]


def test_skip_steps_recomputes_throughput(results):
    runs, _ = read_runs([os.path.join(results, "allreduce_p4.h5"), os.path.join(results, "wagma_p4.h5")])
    rows = _by_file(compare(runs, skip=5))
    # steps 5..19 of 4 ranks x 32 samples: after 5 s (wagma) or 2.5 s (allreduce)
    assert rows["wagma_p4.h5"]["throughput"] == pytest.approx(4 * 32 * 15 / 3.75)
    assert rows["allreduce_p4.h5"]["throughput"] == pytest.approx(4 * 32 * 15 / 7.5)
    assert rows["wagma_p4.h5"]["speedup"] == pytest.approx(2.0)
    assert compare(runs, baseline="wagma")[0]["speedup"] == pytest.approx(8.75 / 10)
    with pytest.raises(ValueError, match="skip"):
        compare(runs, skip=-1)
    with pytest.raises(ValueError, match="target_accuracy"):
        compare(runs, target_accuracy=90)


def _parse_text_table(text):
    lines = text.splitlines()
    assert set(lines[1]) <= {"-", " "}
    header = re.split(r"\s{2,}", lines[0].strip())
    return [dict(zip(header, re.split(r"\s{2,}", line.strip()))) for line in lines[2:]]


def test_text_table(results):
    runs, _ = read_runs([results])
    text = format_table(compare(runs))
    lines = text.splitlines()
    assert len(lines) == 2 + 8
    # aligned: every column of the rule starts where the header's does
    starts = [m.start() for m in re.finditer(r"-+", lines[1])]
    assert len(starts) == 16
    cells = _by_algorithm_ranks(_parse_text_table(text))
    wagma = cells["wagma", "4", "none"]
    assert wagma["samples/s"] == "292.6" and wagma["speedup vs allreduce_sgd"] == "1.14"
    assert (wagma["final acc %"], wagma["best acc %"], wagma["time to 90% (s)"]) == ("90.00", "92.00", "4.0")
    assert (wagma["S"], wagma["tau"], wagma["compute"], wagma["status"]) == ("2", "10", "emulate", "complete")
    assert (wagma["wait ms/step"], wagma["stale"]) == ("15.00", "0.062")
    assert wagma["MB sent/rank"] == f"{25_000 * STEPS / 1e6:.2f}"  # each rank's sum over its steps
    local = cells["local_sgd", "16", "none"]
    empty = ("S", "speedup vs allreduce_sgd", "final acc %", "time to 90% (s)")
    assert [local[k] for k in empty] == ["-"] * 4
    assert local["MB sent/rank"] == "-"  # a file that counted no bytes
    assert cells["wagma", "4", "random:k=2,ms=320"]["speedup vs allreduce_sgd"] == "-"
    assert "partial: 20 of 100 steps" in text and "partial (stopped): 20 of 100 steps" in text


def _by_algorithm_ranks(rows):
    out = {}
    for row in rows:
        out.setdefault((row["algorithm"], row["P"], row["imbalance"]), row)
    return out


def test_markdown_table(results):
    runs, _ = read_runs([results])
    lines = format_table(compare(runs), markdown=True).splitlines()
    assert len(lines) == 2 + 8
    assert all(line.startswith("| ") and line.endswith(" |") for line in lines)
    assert lines[1].startswith("| --- | ---: |")
    assert {line.count(" | ") for line in lines} == {15}
    assert lines[0].startswith("| algorithm | P | S | tau | imbalance | compute | status | samples/s |")


def test_csv(results, tmp_path):
    runs, _ = read_runs([results])
    path = str(tmp_path / "rows.csv")
    write_csv(compare(runs, target_accuracy=0.9), path)
    with open(path, newline="") as f:
        rows = {os.path.basename(r["file"]): r for r in csv.DictReader(f)}
    assert len(rows) == 8
    assert float(rows["wagma_p8.h5"]["throughput"]) == pytest.approx(1280)
    assert float(rows["wagma_p8.h5"]["speedup"]) == pytest.approx(2.5)
    assert rows["local_p16.h5"]["speedup"] == ""
    assert float(rows["wagma_p4.h5"]["time_to_target"]) == 4.0
    assert float(rows["wagma_p4.h5"]["best_accuracy"]) == 0.92
    assert rows["wagma_p8_run2.partial.h5"]["status"] == "partial"
    assert rows["wagma_p8_run2.partial.h5"]["file_status"] == "running"


def test_mean_throughput_prefers_complete_runs():
    rows = [
        {"throughput": 100.0, "status": "complete"},
        {"throughput": 300.0, "status": "complete"},
        {"throughput": 1000.0, "status": "partial"},
        {"throughput": None, "status": "complete"},
    ]
    assert mean_throughput(rows) == 200.0
    assert mean_throughput(rows[2:]) == 1000.0
    assert mean_throughput(rows[3:]) is None


def test_wait_image_bins_long_runs():
    values = np.arange(10, dtype=float).reshape(2, 5)
    binned, width = _binned(values, 2)
    assert width == 3
    np.testing.assert_array_equal(binned, [[1, 3.5], [6, 8.5]])
    same, width = _binned(values, 5)
    assert width == 1 and same is values


def test_to_dataframe(results):
    try:
        import pandas  # noqa: F401  (optional)
    except ImportError:
        with pytest.raises(ImportError, match="pandas"):
            to_dataframe([results])
        return
    frame = to_dataframe([results])
    assert len(frame) == 8 and "speedup" in frame.columns


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "wagma.analysis", *args], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def test_cli_table_and_csv(results, tmp_path):
    table = tmp_path / "rows.csv"
    done = _cli(results, os.path.join(results, "missing.h5"), "--csv", str(table))
    assert done.returncode == 0, done.stderr
    warnings = done.stderr.splitlines()
    assert len(warnings) == 3 and all(line.startswith("wagma.analysis: warning: skipping ") for line in warnings)
    assert any("garbage.h5: not an HDF5 file" in line for line in warnings)
    assert any("not_a_run.h5: not a run file" in line for line in warnings)
    assert any("missing.h5: no such file or directory" in line for line in warnings)
    text, wrote = done.stdout.split("\nwrote ")
    assert len(text.splitlines()) == 2 + 8
    rows = _by_algorithm_ranks(_parse_text_table(text))
    assert len(rows) == 6  # 8 rows; (algorithm, P, imbalance) repeats at P = 8
    assert rows["wagma", "8", "none"]["speedup vs allreduce_sgd"] == "2.50"
    assert rows["allreduce_sgd", "4", "none"]["time to 90% (s)"] == "7.5"
    assert wrote.strip() == str(table)
    assert table.read_text().startswith("file,algorithm,label,ranks,")


def test_cli_plots(results, tmp_path):
    figures = tmp_path / "figures"
    names = ("allreduce_p4.h5", "wagma_p4.h5", "wagma_p8_run2.partial.h5", "wagma_p4_random.h5")
    done = _cli(*(os.path.join(results, name) for name in names), "--plot", str(figures))
    assert done.returncode == 0, done.stderr
    wrote = [line[len("wrote ") :] for line in done.stdout.splitlines() if line.startswith("wrote ")]
    expected = {"throughput.png", "accuracy_vs_time.png", *(f"waits_{name[:-3]}.png" for name in names)}
    assert {os.path.basename(p) for p in wrote} == expected
    assert {p.name for p in figures.iterdir()} == expected
    for name in expected:
        with open(figures / name, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n", name
        assert os.path.getsize(figures / name) > 10_000, name


def test_cli_markdown_and_skip(results):
    done = _cli(
        os.path.join(results, "wagma_p4.h5"),
        os.path.join(results, "allreduce_p4.h5"),
        "--markdown",
        "--skip-steps",
        "5",
        "--target-accuracy",
        "0.8",
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 4 and lines[0].startswith("| algorithm |")
    cells = [c.strip() for c in lines[3].strip("|").split("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    wagma = dict(zip(header, cells))
    assert wagma["algorithm"] == "wagma"
    assert (wagma["samples/s"], wagma["speedup vs allreduce_sgd"], wagma["time to 80% (s)"]) == ("512.0", "2.00", "4.0")


def test_cli_nothing_readable(results):
    done = _cli(os.path.join(results, "garbage.h5"), os.path.join(results, "not_a_run.h5"))
    assert done.returncode == 1
    assert "garbage.h5" in done.stderr and "not_a_run.h5" in done.stderr
    assert "no run file could be read" in done.stderr
    assert done.stdout == ""
    done = _cli(results, "--target-accuracy", "90")
    assert done.returncode == 2 and "--target-accuracy" in done.stderr


# --- labels: variants of one algorithm -------------------------------------------------


@pytest.fixture(scope="module")
def variants(tmp_path_factory):
    """SGP with one and with two neighbours, WAGMA and its ablations, two
    Allreduce-SGD baselines (plain, and with StragglAR syncs), 4 ranks."""
    folder = str(tmp_path_factory.mktemp("variants"))
    _write(folder, "sgp_1n.h5", "sgp", 4, 0.4, options={"peers": 1}, evals=([4, 8], [0.5, 0.7]))
    _write(folder, "sgp_2n.h5", "sgp", 4, 0.5, options={"peers": 2}, evals=([5, 10], [0.6, 0.8]))
    wagma = {
        "group_size": 2,
        "tau": 10,
        "wait_avoiding": True,
        "group_averaging": False,
        "fixed_groups": False,
        "reallocate": False,
        "sync": "allreduce",
    }
    _write(folder, "wagma.h5", "wagma", 4, 0.25, group_size=2, tau=10, options=wagma)
    _write(folder, "wagma_fixed.h5", "wagma", 4, 0.25, group_size=2, tau=10, options={**wagma, "fixed_groups": True})
    _write(
        folder,
        "wagma_beta.h5",
        "wagma",
        4,
        0.3,
        group_size=2,
        tau=10,
        options={**wagma, "wait_avoiding": False, "group_averaging": True},
    )
    _write(folder, "wagma_none.h5", "wagma", 4, 0.2, group_size=2, tau=10, options={**wagma, "wait_avoiding": False})
    _write(folder, "allreduce.h5", "allreduce_sgd", 4, 1.0, options={"bucket_cap_mb": 25.0, "sync": "allreduce"})
    _write(
        folder, "allreduce_stragglar.h5", "allreduce_sgd", 4, 0.5, options={"bucket_cap_mb": 25.0, "sync": "stragglar"}
    )
    return folder


def test_labels_tell_sgp_with_one_and_two_neighbours_apart(variants):
    runs, _ = read_runs([os.path.join(variants, "sgp_1n.h5"), os.path.join(variants, "sgp_2n.h5")])
    rows = compare(runs, baseline="sgp (1n)")
    assert [(r["algorithm"], r["label"]) for r in rows] == [("sgp", "sgp (1n)"), ("sgp", "sgp (2n)")]
    assert [r["speedup"] for r in rows] == [pytest.approx(1.0), pytest.approx(0.4 / 0.5)]
    text = format_table(rows)
    cells = _parse_text_table(text)
    assert [c["algorithm"] for c in cells] == ["sgp (1n)", "sgp (2n)"]
    assert "speedup vs sgp (1n)" in text.splitlines()[0]
    # The bare name as baseline: every sgp run, 1n and 2n, is the reference.
    mean = (4 * 32 * 20 / 8 + 4 * 32 * 20 / 10) / 2
    assert compare(runs, baseline="sgp")[0]["speedup"] == pytest.approx(4 * 32 * 20 / 8 / mean)


def test_labels_of_wagmas_ablations_and_of_a_stragglar_sync(variants):
    runs, _ = read_runs([variants])
    rows = _by_file(compare(runs))
    labels = {name: row["label"] for name, row in rows.items()}
    assert labels == {
        "sgp_1n.h5": "sgp (1n)",
        "sgp_2n.h5": "sgp (2n)",
        "wagma.h5": "wagma",
        "wagma_fixed.h5": "wagma (fixed groups)",
        "wagma_beta.h5": "wagma (group averaging)",
        "wagma_none.h5": "wagma (no group collectives)",
        "allreduce.h5": "allreduce_sgd",
        "allreduce_stragglar.h5": "allreduce_sgd (stragglar sync)",
    }
    assert {row["algorithm"] for name, row in rows.items() if name.startswith("wagma")} == {"wagma"}
    assert {row["algorithm"] for name, row in rows.items() if name.startswith("allreduce")} == {"allreduce_sgd"}
    # The plain allreduce_sgd is the baseline; its StragglAR variant is a run like the others.
    assert rows["allreduce_stragglar.h5"]["speedup"] == pytest.approx(2.0)
    assert rows["wagma_fixed.h5"]["speedup"] == pytest.approx(4.0)


def test_label_column_in_csv_and_markdown(variants, tmp_path):
    runs, _ = read_runs([variants])
    rows = compare(runs)
    path = str(tmp_path / "rows.csv")
    write_csv(rows, path)
    with open(path, newline="") as f:
        read = {os.path.basename(r["file"]): r for r in csv.DictReader(f)}
    assert list(read["sgp_2n.h5"])[:3] == ["file", "algorithm", "label"] == list(ROW_FIELDS[:3])
    assert (read["sgp_2n.h5"]["algorithm"], read["sgp_2n.h5"]["label"]) == ("sgp", "sgp (2n)")
    markdown = format_table(rows, markdown=True)
    assert "| wagma (fixed groups) | 4 | 2 | 10 |" in markdown


def test_label_of_a_simulated_run_and_of_a_file_without_options():
    """Simulated runs record their options under ``options``; an old file none."""

    def run(algorithm, config):
        return Run("x.h5", {"algorithm": algorithm, "config": json.dumps(config)})

    assert run_label(run("wagma", {"options": {"wait_avoiding": True, "fixed_groups": True}})) == "wagma (fixed groups)"
    assert (
        run_label(run("wagma", {"options": {"wait_avoiding": False, "group_averaging": True, "fixed_groups": True}}))
        == "wagma (group averaging, fixed groups)"
    )
    eager = {"quorum": "majority", "late": "drop", "limiter": 0, "activator_seed": 0}
    assert run_label(run("eager_sgd", {"options": eager})) == "eager_sgd"
    assert run_label(run("eager_sgd", {"options": {**eager, "quorum": "solo", "limiter": 32}})) == "eager_sgd (solo)"
    assert (
        run_label(run("eager_sgd", {"options": {**eager, "quorum": "solo", "limiter": 0}}))
        == "eager_sgd (solo, limiter 0)"
    )
    assert (
        run_label(run("eager_sgd", {"options": {**eager, "quorum": "half", "late": "accumulate"}}))
        == "eager_sgd (half, accumulate)"
    )
    # Files from before the late reading was an option carried late gradients over, with no limiter, and
    # their majority started a version at the first ceil(P/2) arrivals.
    assert run_label(run("eager_sgd", {"options": {"quorum": "solo"}})) == "eager_sgd (solo, accumulate, limiter 0)"
    assert run_label(run("eager_sgd", {"options": {"quorum": "majority"}})) == "eager_sgd (half, accumulate)"
    assert run_label(run("local_sgd", {"algorithm_options": {"period": 10, "reallocate": False}})) == "local_sgd"
    assert (
        run_label(run("local_sgd", {"algorithm_options": {"period": 1, "reallocate": True}}))
        == "local_sgd (reallocate)"
    )
    assert run_label(run("sgp", {})) == "sgp"
    assert run_label(Run("x.h5", {"algorithm": "sgp", "config": "not json"})) == "sgp"


def _figure_lines(monkeypatch):
    """The (legend label, colour) of every line of the next figure saved."""
    seen, save = [], plots._save

    def spy(plt, fig, title, path):
        seen.extend((line.get_label(), line.get_color()) for ax in fig.axes for line in ax.get_lines())
        return save(plt, fig, title, path)

    monkeypatch.setattr(plots, "_save", spy)
    return seen


def test_plots_draw_each_variant_as_its_own_line(variants, tmp_path, monkeypatch):
    runs, _ = read_runs(
        [
            os.path.join(variants, "sgp_1n.h5"),
            os.path.join(variants, "sgp_2n.h5"),
            os.path.join(variants, "wagma.h5"),
            os.path.join(variants, "wagma_fixed.h5"),
        ]
    )
    lines = _figure_lines(monkeypatch)
    assert plots.plot_throughput(compare(runs), str(tmp_path / "throughput.png"))
    assert [label for label, _ in lines] == ["sgp (1n)", "sgp (2n)", "wagma", "wagma (fixed groups)"]
    assert len({color for _, color in lines}) == 4
    lines.clear()
    assert plots.plot_accuracy(runs, str(tmp_path / "accuracy.png"))  # the sgp runs have evaluations
    assert [label for label, _ in lines] == ["sgp (1n), P=4", "sgp (2n), P=4"]
    assert len({color for _, color in lines}) == 2


def test_the_accuracy_plot_tells_runs_of_one_label_and_different_tau_apart(tmp_path, monkeypatch):
    # The main job's local SGD with period 1 (the paper's baseline) and 10 (ablation 1): one label,
    # whose tau column tells them apart in the table; in the figure each needs its own line and colour.
    paths = [
        _write(
            str(tmp_path),
            f"local_tau{tau}.h5",
            "local_sgd",
            4,
            0.5,
            tau=tau,
            options={"period": tau, "reallocate": False},
            evals=([5, 10], [0.6, 0.1 * tau]),
        )
        for tau in (1, 10)
    ]
    runs, _ = read_runs(paths)
    lines = _figure_lines(monkeypatch)
    assert plots.plot_accuracy(runs, str(tmp_path / "accuracy.png"))
    assert [label for label, _ in lines] == ["local_sgd, tau 1, P=4", "local_sgd, tau 10, P=4"]
    assert len({color for _, color in lines}) == 2


def test_the_last_epochs_mean_accuracy_averages_its_evaluations(tmp_path):
    """Four evaluations an epoch (``--eval-every 0.25``) over two epochs: the
    last epoch's mean takes the four of epoch (1, 2], not the final one alone."""
    accuracy = [0.2, 0.4, 0.5, 0.6, 0.7, 0.9, 0.6, 0.8]
    path = _write(
        str(tmp_path), "eager.h5", "eager_sgd", 4, 0.5, evals=(np.arange(1, 9), accuracy), epochs=np.arange(1, 9) / 4
    )
    (row,) = compare([path])
    assert row["final_accuracy"] == 0.8
    assert row["last_epoch_accuracy"] == pytest.approx((0.7 + 0.9 + 0.6 + 0.8) / 4)
    assert row["best_accuracy"] == 0.9
    assert "last-epoch acc %" in format_table([row])


def test_spread_groups_repeated_runs_by_variant_and_ranks(tmp_path):
    """Three runs of one variant and one of another: each variant's range and
    mean over its runs, in the order the variants first appear."""
    from wagma.analysis.spread import format_spread, spread_rows

    folder = str(tmp_path)
    paths = [
        _write(folder, f"wagma_{k}.h5", "wagma", 4, 0.5, group_size=2, tau=10, evals=([1, 2], [0.5, final]))
        for k, final in enumerate((0.8, 0.9, 0.7))
    ]
    paths.append(_write(folder, "local.h5", "local_sgd", 4, 0.5, tau=10, evals=([1, 2], [0.4, 0.6])))
    order = {p: i for i, p in enumerate(paths)}
    rows = spread_rows(sorted(compare(paths), key=lambda r: order[r["file"]]))
    assert [(r["label"], r["ranks"], r["runs"]) for r in rows] == [("wagma", 4, 3), ("local_sgd", 4, 1)]
    assert rows[0]["final_accuracy"] == pytest.approx((0.7, 0.9, 0.8))
    assert rows[1]["final_accuracy"] == pytest.approx((0.6, 0.6, 0.6))
    table = format_spread(rows, markdown=True)
    assert "| wagma | 4 | 3 | 70.0-90.0 | 80.0 | 70.0-90.0 | 80.0 | 0.00 |" in table
