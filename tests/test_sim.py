"""The scale simulator (wagma.sim): closed forms, the algorithms' waiting rules, files, CLI, validation."""

import math
from pathlib import Path

import h5py
import numpy as np
import pytest

from collectives.stragglar.cost import rhd_time, ring_time, stragglar_time
from collectives.stragglar.generator import lower_bound
from wagma.analysis.table import compare
from wagma.results import load_run
from wagma.sim import Network, Scenario, compute_times, save, simulate
from wagma.sim.cli import main as sim_main

ROOT = Path(__file__).resolve().parent.parent
NET = Network(alpha=5e-6, beta=1e-9)
BIG = 1_000_000        # parameters: 4 MB messages, over the runtime's 1 MiB threshold
SMALL = 10_000         # 40 kB: recursive doubling


def scenario(ranks=8, steps=40, imbalance="none", parameters=BIG, **kw):
    return Scenario(ranks=ranks, steps=steps, network=NET, parameters=parameters, imbalance=imbalance,
                    compute_ms=kw.pop("compute_ms", 100.0), **kw)


def step_times(run):
    return np.diff(np.concatenate([np.zeros((run.steps["clock"].shape[0], 1)), run.steps["clock"]], axis=1))


def test_allreduce_sgd_without_imbalance_is_compute_plus_the_alpha_beta_allreduce():
    run = simulate("allreduce_sgd", scenario(), bucket_cap_mb=25.0)
    expected = 0.1 + rhd_time(8, 4 * BIG, NET.alpha, NET.beta)     # power of two, >= 1 MiB: RHD
    assert np.allclose(step_times(run), expected, rtol=0, atol=1e-12)
    assert run.summary["throughput"] == pytest.approx(8 * 128 / expected)


def test_the_global_allreduce_follows_the_runtimes_schedule_choice():
    ring = simulate("local_sgd", scenario(ranks=6), period=1)      # not a power of two: ring
    assert np.allclose(step_times(ring), 0.1 + ring_time(6, 4 * BIG, NET.alpha, NET.beta))
    small = simulate("local_sgd", scenario(parameters=SMALL), period=1)   # < 1 MiB: recursive doubling
    assert np.allclose(step_times(small), 0.1 + 3 * NET.message(4 * SMALL))
    # Buckets: one allreduce per 25 MiB bucket, one after another.
    bucketed = simulate("allreduce_sgd", scenario(parameters=10_000_000), bucket_cap_mb=25.0)
    cap = 25 * 2**20
    buckets = [cap, 40_000_000 - cap]
    assert np.allclose(step_times(bucketed), 0.1 + sum(rhd_time(8, b, NET.alpha, NET.beta) for b in buckets))


def test_allreduce_sgd_waits_for_the_slowest_rank_at_every_step():
    sc = scenario(imbalance="random:k=2,ms=320", seed=3)
    run = simulate("allreduce_sgd", sc, bucket_cap_mb=25.0)
    compute = compute_times(sc)
    cost = rhd_time(8, 4 * BIG, NET.alpha, NET.beta)
    assert np.allclose(step_times(run), compute.max(axis=0) + cost)
    assert np.allclose(run.steps["delay"], compute - 0.1)
    assert np.allclose(run.steps["compute_time"] + run.steps["wait_time"], run.steps["step_time"])


def test_neighbour_algorithms_without_imbalance_cost_their_sends():
    message = NET.message(4 * BIG)
    assert np.allclose(step_times(simulate("dpsgd", scenario())), 0.1 + 2 * message)
    assert np.allclose(step_times(simulate("sgp", scenario(), peers=2)), 0.1 + 2 * message)
    # AD-PSGD never waits while an exchange (there and back) is shorter than a step.
    adpsgd = simulate("adpsgd", scenario(imbalance="straggler:rank=1,ms=50"))
    assert np.allclose(step_times(adpsgd), compute_times(scenario(imbalance="straggler:rank=1,ms=50")))


def test_dpsgd_waits_for_its_ring_neighbours_only():
    sc = scenario(ranks=16, steps=3, imbalance="straggler:rank=5,ms=300")
    steps = step_times(simulate("dpsgd", sc))
    late = 0.1 + 0.3 + 2 * NET.message(4 * BIG)
    # Step 0: ranks 4, 5, 6 wait for rank 5; everyone else does not.
    assert np.allclose(steps[[4, 5, 6], 0], late) and np.all(steps[[0, 1, 2, 8, 15], 0] < 0.2)
    # The delay spreads one ring hop per step.
    assert steps[3, 1] > 0.3 and steps[2, 1] < 0.2


def test_local_sgd_and_wagma_sync_steps_wait_for_the_slowest_rank_of_the_period():
    sc = scenario(imbalance="random:k=2,ms=320", seed=1, steps=30)
    compute = compute_times(sc)
    cost = rhd_time(8, 4 * BIG, NET.alpha, NET.beta)
    clock = simulate("local_sgd", sc, period=10).steps["clock"]
    for end in (9, 19, 29):
        first = end - 9
        start = 0.0 if first == 0 else clock[0, first - 1]
        assert np.allclose(clock[:, end], start + compute[:, first:end + 1].sum(axis=1).max() + cost)


def test_wagma_without_imbalance_is_compute_plus_the_butterfly_phases():
    run = simulate("wagma", scenario(parameters=SMALL, steps=20), group_size=4, tau=10)
    steps = step_times(run)
    group = 0.1 + 2 * NET.message(4 * SMALL)                  # log2 S = 2 phases of recursive doubling
    sync = 0.1 + 3 * NET.message(4 * SMALL)                   # the global allreduce, P = 8
    assert np.allclose(steps[:, [0, 5, 10, 18]], group) and np.allclose(steps[:, [9, 19]], sync)
    assert not run.steps["stale"].any() and not run.age.any()


def test_wagma_with_tau_1_is_synchronous_model_averaging():
    sc = scenario(imbalance="random:k=2,ms=320", seed=7)
    wagma = simulate("wagma", sc, group_size=4, tau=1)
    local = simulate("local_sgd", sc, period=1)
    assert np.array_equal(wagma.steps["clock"], local.steps["clock"])
    assert not wagma.steps["stale"].any()


def test_wagma_does_not_wait_for_a_straggler_between_sync_steps():
    sc = scenario(steps=40, imbalance="straggler:rank=3,ms=200")
    run = simulate("wagma", sc, group_size=4, tau=10)
    steps, stale = step_times(run), run.steps["stale"]
    group_steps = [t for t in range(40) if (t + 1) % 10]
    fast = [r for r in range(8) if r != 3]
    assert np.all(steps[np.ix_(fast, group_steps)] < 0.15)          # no 200 ms waits
    assert stale[3, group_steps].all() and run.age[3, 8] == 9       # fresh only at sync steps
    # A fast rank is stale only when an activation beat its own arrival by microseconds
    # (its partner was the straggler, whose version started a hop later): one step old at most.
    assert stale[fast].mean() < 0.25 and run.age[fast].max() <= 1
    # The same groups without activation (Algorithm 2's beta, blocking) wait for it.
    blocking = step_times(simulate("wagma", sc, group_size=4, tau=10, wait_avoiding=False, group_averaging=True))
    assert np.all(blocking[:, group_steps].max(axis=0) >= 0.3)


def test_eager_sgd_majority_does_not_wait_for_a_minority_of_late_ranks():
    quiet = simulate("eager_sgd", scenario(), quorum="majority")
    activation = 3 * NET.alpha
    assert np.allclose(step_times(quiet), 0.1 + activation + rhd_time(8, 4 * BIG, NET.alpha, NET.beta))
    late = simulate("eager_sgd", scenario(imbalance="straggler:rank=2,ms=300"), quorum="majority")
    assert late.steps["stale"][2].all() and not np.delete(late.steps["stale"], 2, axis=0).any()
    assert np.all(np.delete(step_times(late), 2, axis=0) < 0.15)


def test_hierarchical_sgd_averages_the_largest_firing_level_in_consecutive_groups():
    sc = scenario(steps=12, imbalance="straggler:rank=1,ms=100")
    steps = step_times(simulate("hierarchical_sgd", sc, period_group_size_dict={2: 4, 10: 8}, warmup_steps=0))
    four = rhd_time(4, 4 * BIG, NET.alpha, NET.beta)
    # t = 0 and 10: the level of 8 fires; t = 2, 4, ...: groups {0..3}, {4..7}; odd t: nothing.
    assert np.allclose(steps[:, 0], 0.2 + rhd_time(8, 4 * BIG, NET.alpha, NET.beta))
    assert np.allclose(steps[:, 1], [0.1, 0.2, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1])
    # Rank 1 started step 2 0.1 s after its group and took 0.1 s longer.
    assert np.allclose(steps[[0, 2, 3], 2], 0.3 + four) and np.allclose(steps[1, 2], 0.2 + four)
    assert np.allclose(steps[4:, 2], 0.1 + four)


def test_stragglar_hides_the_reduce_scatter_behind_a_late_rank():
    sc = scenario(steps=5, imbalance="straggler:rank=7,ms=50", collective="stragglar")
    run = simulate("local_sgd", sc, period=1)
    expected = 0.15 + stragglar_time(8, 4 * BIG, NET.alpha, NET.beta, lower_bound(8))
    assert np.allclose(step_times(run), expected)


def test_ensemble_sync_without_late_ranks_waits_for_the_slowest_like_local_sgd_plus_its_tree():
    sc = scenario(imbalance="random:k=2,ms=320", seed=1, steps=30)
    compute = compute_times(sc)
    tree = 2 * 3 * NET.message(4 * BIG) + 2 * NET.message(0)      # 8 members: 2 log2 8 messages, report + decision
    run = simulate("ensemble_sync", sc, period=10, timeout_s=60.0)
    clock = run.steps["clock"]
    for end in (9, 19, 29):
        first = end - 9
        start = 0.0 if first == 0 else clock[0, first - 1]
        assert np.allclose(clock[:, end], start + compute[:, first:end + 1].sum(axis=1).max() + tree)
    assert not run.steps["skipped"].any()


def test_ensemble_sync_does_not_wait_for_a_rank_later_than_the_timeout_which_skips_forward():
    # Rank 1 is 30 ms late at every step: 150 ms per round of 5, over the 50 ms timeout.
    sc = scenario(imbalance="straggler:rank=1,ms=30", steps=40, parameters=SMALL)
    run = simulate("ensemble_sync", sc, period=5, timeout_s=0.05)
    skipped = run.steps["skipped"]
    others = [r for r in range(8) if r != 1]
    assert not skipped[others].any() and skipped[1].any()
    # The others never wait more than the timeout and the average at a round's end.
    tree = 2 * 3 * NET.message(4 * SMALL) + 2 * NET.message(0)
    assert np.all(run.steps["wait_time"][others] <= 0.05 + tree + 1e-9)
    # Rank 1 misses round 0 (steps 0-4), rejoins at the end of round 1 having
    # skipped its steps 5-9, so it is late by one round's delay again: every other round.
    np.testing.assert_array_equal(np.flatnonzero(skipped[1]), [s for s in range(40) if (s // 5) % 2 == 1])
    assert run.summary["samples"] == sc.batch_size * (8 * 40 - skipped[1].sum())


def test_results_reproduce_from_the_seed():
    a = simulate("wagma", scenario(imbalance="random:k=2,ms=320", seed=5), group_size=4)
    b = simulate("wagma", scenario(imbalance="random:k=2,ms=320", seed=5), group_size=4)
    c = simulate("wagma", scenario(imbalance="random:k=2,ms=320", seed=6), group_size=4)
    assert np.array_equal(a.steps["clock"], b.steps["clock"]) and np.array_equal(a.age, b.age)
    assert not np.array_equal(a.steps["clock"], c.steps["clock"])


@pytest.mark.parametrize("algorithm, options, message", [
    ("nonesuch", {}, "algorithm must be one of"),
    ("wagma", {}, "wagma needs group_size"),
    ("wagma", {"group_size": 3}, "power of two"),
    ("sgp", {"peers": 9}, "peers must be an int from 1 to ceil(log2 P) = 3"),
    ("eager_sgd", {"quorum": "half"}, "quorum must be 'solo' or 'majority'"),
    ("local_sgd", {"tau": 10}, "tau: not an option of local_sgd; accepted: period, reallocate"),
    ("local_sgd", {"reallocate": True}, "reallocate: the simulator does not model the reallocation"),
    ("ensemble_sync", {"timeout_s": 0}, "timeout_s must be a number of seconds above 0"),
    ("hierarchical_sgd", {"period_group_size_dict": {2: 16}}, "group size 16 exceeds the 8 ranks"),
])
def test_bad_options_are_refused_with_the_accepted_values(algorithm, options, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        simulate(algorithm, scenario(), **options)


def test_bad_scenarios_are_refused():
    with pytest.raises(ValueError, match="adpsgd needs an even number of ranks, got 5"):
        simulate("adpsgd", scenario(ranks=5))
    with pytest.raises(ValueError, match="power of two"):
        simulate("eager_sgd", scenario(ranks=6))
    with pytest.raises(ValueError, match="collective must be one of auto, ring"):
        scenario(collective="tree")
    with pytest.raises(ValueError, match="ranks must be an int >= 1"):
        scenario(ranks=0)
    with pytest.raises(ValueError, match="--imbalance 'random:k=2'"):
        simulate("dpsgd", scenario(imbalance="random:k=2"))


def test_simulated_files_sit_beside_measured_ones_in_the_analysis(tmp_path):
    measured = load_run(str(ROOT / "results" / "sweep" / "wagma_p8.h5"))
    runs = []
    for algo, options in (("wagma", measured.config["algorithm_options"]), ("allreduce_sgd", {"bucket_cap_mb": 25.0})):
        sc = Scenario(ranks=8, steps=50, network=NET, parameters=int(measured.attrs["parameters"]),
                      imbalance=measured.attrs["imbalance"], compute_ms=600.0, model="resnet20")
        runs.append(load_run(save(simulate(algo, sc, **options), str(tmp_path / f"{algo}.h5"))))
    assert runs[0].attrs["kind"] == "simulated" and runs[0].attrs["compute"] == "simulated"
    with h5py.File(tmp_path / "wagma.h5") as f:
        assert f["sim/age"].shape == (8, 50)
    rows = compare([measured, *runs], skip=5)
    kinds = {(row["algorithm"], row["compute"]): row for row in rows}
    assert set(kinds) == {("wagma", "emulate"), ("wagma", "simulated"), ("allreduce_sgd", "simulated")}
    assert kinds[("wagma", "emulate")]["speedup"] is None          # no measured baseline among these
    sim = kinds[("wagma", "simulated")]
    assert sim["speedup"] == pytest.approx(sim["throughput"] / kinds[("allreduce_sgd", "simulated")]["throughput"])


def test_the_cli_prints_the_table_and_writes_files_and_the_figure(tmp_path, capsys):
    status = sim_main(["--algo", "allreduce_sgd,wagma,sgp", "--ranks", "16,64", "--steps", "50",
                       "--parameters", "1000000", "--peers", "2", "--out-dir", str(tmp_path / "runs"),
                       "--plot", str(tmp_path / "figs")])
    out = capsys.readouterr()
    assert status == 0
    table, spread = out.out.split("\n\n")
    expected = sorted((a, p) for a in ("allreduce_sgd", "wagma", "sgp") for p in ("16", "64"))
    assert sorted(tuple(line.split()[:2]) for line in table.splitlines()[2:]) == expected
    spread = [line.split() for line in spread.splitlines()]
    assert spread[0][:4] == ["algorithm", "P", "wait", "ms/step:"]
    assert sorted(tuple(cells[:2]) for cells in spread[2:]) == expected
    waits = {tuple(cells[:2]): [float(c) for c in cells[2:5]] for cells in spread[2:]}
    assert all(least <= median <= most for least, median, most in waits.values())
    assert "6 simulations of 50 steps" in out.err
    assert (tmp_path / "figs" / "throughput.png").stat().st_size > 0
    run = load_run(str(tmp_path / "runs" / "wagma_p64.h5"))
    assert (run.attrs["group_size"], run.attrs["tau"], run.steps["clock"].shape) == (8, 10, (64, 50))


@pytest.mark.parametrize("argv, message", [
    (["--algo", "sgd"], "--algo must be all or a comma-separated list"),
    (["--ranks", "6", "--algo", "wagma"], "power of two"),
    (["--beta-gbps", "0"], "--beta-gbps > 0"),
    (["--ranks", "4,x"], "expected comma-separated integers"),
])
def test_the_cli_refuses_bad_input_with_a_message(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        sim_main([*argv, "--parameters", "1000", "--steps", "5"])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_the_model_option_sizes_messages_by_the_real_parameter_count(capsys):
    sim_main(["--algo", "dpsgd", "--ranks", "4", "--steps", "5", "--model", "resnet20"])
    assert "272,474 parameters" in capsys.readouterr().err


def test_the_simulator_predicts_the_measured_sweep_within_15_percent(tmp_path):
    from experiments.validate_sim import TOLERANCE, validate
    table, worst, network = validate(str(ROOT / "results" / "sweep"), str(tmp_path))
    assert worst <= TOLERANCE, table
    assert table.count("| wagma |") == 4 and math.isfinite(network.alpha)
