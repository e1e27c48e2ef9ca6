"""``experiments.train`` end to end under mpiexec, for every algorithm: the run file it writes.

Each rank calls ``experiments.train.main`` with the same command line (as
``mpiexec -n P python -m experiments.train`` would); rank 0 then reads the
run file and checks that its datasets are complete and consistent with
each other, with the imbalance model and with the attributes.
"""

import json
import os

import numpy as np
import pytest
from mpi4py import MPI

from experiments.train import main
from wagma.imbalance import parse_imbalance
from wagma.results import STEP_FIELDS, load_run, partial_path, rows_path

pytestmark = pytest.mark.mpi

WORLD = MPI.COMM_WORLD
P = WORLD.size
IMBALANCE = "random:k=1,ms=4"
ENSEMBLE_PERIOD = 3
EPOCHS = 2


def _algorithms():
    yield "allreduce_sgd", []
    yield "local_sgd", ["--period", "4"]
    yield "hierarchical_sgd", ["--period-group-size-dict", f"2:{min(2, P)},4:P"]
    yield "dpsgd", []
    yield "sgp", ["--peers", "1"]
    yield "ensemble_sync", ["--period", str(ENSEMBLE_PERIOD), "--timeout-s", "30"]
    yield "wagma", ["--tau", "4"]
    yield "eager_sgd", ["--quorum", "majority"]
    yield "adpsgd", []


# The run file's format is checked at 4 ranks: the writer and the checks are
# the same at any rank count, P rows a field.  At 2 ranks the
# partial collectives run too (about 1 s each): their stale contributions and
# the contribution column depend on who is late, and eager-SGD's majority is
# one rank there.  At 8 none runs (27 s of training that checked nothing new).
PARTIAL = ("wagma", "eager_sgd")


def _run_file_params():
    for algo, extra in _algorithms():
        if P > 4:
            reason = f"the run file's format is checked at 4 ranks; {P} ranks write the same fields, {P} rows each"
        elif P == 2 and algo not in PARTIAL:
            reason = (
                f"{algo}'s run file is checked at 4 ranks; at 2 "
                f"only the partial collectives', whose stale contributions depend on who is late"
            )
        else:
            reason = None
        yield pytest.param(algo, extra, id=algo, marks=pytest.mark.skipif(reason is not None, reason=reason or ""))


@pytest.mark.timing  # the imbalance sleeps: late ranks, stale contributions, rounds that time out
@pytest.mark.parametrize("algo, extra", list(_run_file_params()))
def test_run_file_is_complete_and_consistent(algo, extra, shared_dir):
    out = os.path.join(shared_dir, f"{algo}.h5")
    # Two evaluations an epoch (ensemble_sync scores its ensembles once an epoch).
    eval_every = "1" if algo == "ensemble_sync" else "0.5"
    rc = main(
        [
            "--algo",
            algo,
            "--dataset",
            "digits",
            "--model",
            "mlp",
            "--epochs",
            str(EPOCHS),
            "--imbalance",
            IMBALANCE,
            "--seed",
            "5",
            "--out",
            out,
            "--no-progress",
            "--eval-every",
            eval_every,
            *extra,
        ]
    )
    assert rc == 0
    WORLD.Barrier()
    if WORLD.rank:
        return
    assert not os.path.exists(partial_path(out)) and not os.path.exists(rows_path(out))  # nor the logs
    run = load_run(out)
    a = run.attrs
    assert (a["status"], a["algorithm"], a["ranks"], a["compute"], a["imbalance"]) == (
        "complete",
        algo,
        P,
        "real",
        IMBALANCE,
    )
    assert json.loads(a["config"])["algo"] == algo
    per_epoch, total = a["steps_per_epoch"], a["steps_planned"]
    assert total == EPOCHS * per_epoch > 0
    s = run.steps
    for name in STEP_FIELDS:
        assert s[name].shape == (P, total), name
        assert np.all(np.isfinite(s[name])) or name == "contribution", name
    # The iteration each rank's contribution was of: the step itself where fresh, an older one
    # (or -1: the initial model, nothing) where stale; only the partial collectives have one.
    if algo in ("wagma", "eager_sgd"):
        steps, fresh = np.arange(total), s["stale"] == 0
        assert np.all(s["contribution"][fresh] == np.broadcast_to(steps, (P, total))[fresh])
        assert np.all((s["contribution"][~fresh] >= -1) & (s["contribution"][~fresh] < steps.max()))
    else:
        assert np.isnan(s["contribution"]).all()
    # The delays injected are the imbalance model's, on every rank.
    np.testing.assert_array_equal(s["delay"], parse_imbalance(IMBALANCE, P, seed=5).table(total).T)
    assert np.all(s["compute_time"] >= s["delay"])
    assert np.all(s["wait_time"] <= s["comm_time"] + 1e-9) and np.all(s["wait_time"] >= 0)
    assert np.all(s["step_time"] >= s["compute_time"] + s["comm_time"] - 1e-6)
    assert np.all(np.diff(s["clock"], axis=1) > 0)
    np.testing.assert_allclose(s["clock"][:, -1], s["step_time"].sum(axis=1), rtol=1e-6)
    if algo not in ("wagma", "eager_sgd"):
        assert not s["stale"].any()
    # One evaluation an epoch for ensemble_sync, two for the others, the last one of the final model.
    e = run.eval
    if algo == "ensemble_sync":
        # It scores the last ensemble at or before each epoch's end: the last
        # round's end (a multiple of the period, or the run's last step).
        ends = [
            total if k == EPOCHS else k * per_epoch // ENSEMBLE_PERIOD * ENSEMBLE_PERIOD for k in range(1, EPOCHS + 1)
        ]
        np.testing.assert_array_equal(e["step"], sorted(set(ends)))
    else:
        interval = round(per_epoch / 2)
        np.testing.assert_array_equal(e["step"], sorted({*range(interval, total + 1, interval), total}))
    assert np.all((0 <= e["accuracy"]) & (e["accuracy"] <= 1)) and np.all(np.isfinite(e["loss"]))
    # An evaluation is stamped with the slowest rank's training clock at the end of the step it
    # evaluates (wagma.clock.TrainingClock): evaluations themselves are not on the clock, so
    # the stamps grow with the steps, however long an evaluation or its wait for a peer takes.
    if algo == "ensemble_sync":  # rank 0 alone scores the ensemble, on its own clock: nobody waits for it
        np.testing.assert_array_equal(e["clock"], s["clock"][0, e["step"].astype(int) - 1])
    else:
        np.testing.assert_array_equal(e["clock"], s["clock"][:, e["step"].astype(int) - 1].max(axis=0))
    assert np.all(np.diff(e["clock"]) > 0)
    summary = run.summary
    assert summary["final_accuracy"] == e["accuracy"][-1]
    last_epoch = e["epoch"] > EPOCHS - 1  # the evaluations of the last epoch's steps
    assert np.array_equal(last_epoch, e["step"] > total - per_epoch)
    assert last_epoch.sum() >= (1 if algo == "ensemble_sync" else 2)
    assert summary["last_epoch_accuracy"] == pytest.approx(e["accuracy"][last_epoch].mean())
    assert summary["throughput"] == pytest.approx(P * a["batch_size"] * total / s["clock"][:, -1].max())


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--model", "resnet50", "--dataset", "digits"], ["resnet50", "accepted models for it: mlp"]),
        (["--dataset", "cifar10", "--data-dir", "/no/such/folder"], ["--data-dir", "/no/such/folder", "data_batch_1"]),
        (["--imbalance", "random:k=2"], ["--imbalance", "missing ms"]),
        (["--chaos", "mtbf=0"], ["--chaos 'mtbf=0'", "mtbf must be above zero", "accepted form: mtbf=SEC"]),
        (["--chaos", "mtbf=10,kinds=sigkill+bite"], ["--chaos", "kinds must be distinct names of sigkill"]),
    ],
    ids=["model", "data-path", "imbalance", "chaos-mtbf", "chaos-kind"],
)
def test_bad_options_fail_on_every_rank_before_training(argv, words, shared_dir, capsys):
    out = os.path.join(shared_dir, "never.h5")
    rc = main(["--algo", "local_sgd", "--out", out, *argv])
    assert rc == 2
    assert not os.path.exists(out) and not os.path.exists(partial_path(out))
    err = capsys.readouterr().err
    if WORLD.rank == 0:
        assert all(w in err for w in words), err
    else:
        assert err == ""  # one report, from rank 0


@pytest.mark.timing
def test_emulated_and_padded_compute(shared_dir):
    """Emulated steps sleep --compute-ms plus the delay and train nothing;
    real steps are padded up to --compute-ms."""
    emulated, padded = os.path.join(shared_dir, "emulated.h5"), os.path.join(shared_dir, "padded.h5")
    assert (
        main(
            [
                "--algo",
                "allreduce_sgd",
                "--dataset",
                "synthetic",
                "--model",
                "resnet20",
                "--compute",
                "emulate",
                "--compute-ms",
                "10",
                "--max-steps",
                "6",
                "--batch-size",
                "4",
                "--imbalance",
                IMBALANCE,
                "--out",
                emulated,
                "--no-progress",
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "--algo",
                "local_sgd",
                "--epochs",
                "1",
                "--max-steps",
                "8",
                "--compute-ms",
                "20",
                "--out",
                padded,
                "--no-progress",
            ]
        )
        == 0
    )
    WORLD.Barrier()
    if WORLD.rank:
        return
    run = load_run(emulated)
    assert (run.attrs["compute"], run.attrs["compute_ms"], run.attrs["model"]) == ("emulate", 10.0, "resnet20")
    assert np.all(np.isnan(run.steps["loss"])) and run.eval["step"].size == 0
    assert np.all(run.steps["compute_time"] >= 0.010 + run.steps["delay"])
    run = load_run(padded)
    assert run.attrs["compute_ms"] == 20.0 and np.all(np.isfinite(run.steps["loss"]))
    # Step t sleeps max(0, 20 ms - c_{t-1}) before a forward/backward of c_t (c_{-1} = 0), so
    # the compute times of T steps add up to at least T x 20 ms + c_{T-1}, whatever each c is.
    steps = run.steps["compute_time"].shape[1]
    assert np.all(run.steps["compute_time"].sum(axis=1) >= steps * 0.020)
