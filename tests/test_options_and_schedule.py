"""The training command line's checks and the learning-rate schedule (no MPI)."""

import subprocess
import sys

import pytest

from experiments.options import build_parser, usage_problem
from experiments.schedule import LearningRate
from wagma.algorithms import ALGORITHMS
from wagma.options import ALGORITHM_NAMES, OPTIONS, auto_group_size, options_problem, resolved_options
from wagma.options.cli import flags_problem, options_from_args
from wagma.options.fit import fit_options


def _args(*argv):
    return build_parser().parse_args(["--algo", *argv])


def algorithm_options(args, ranks):
    """The options a training run with ``args`` on ``ranks`` ranks uses and records."""
    return resolved_options(args.algo, ranks, options_from_args(args, args.algo)).as_dict()


def test_warm_up_then_step_decay():
    lr = LearningRate(0.1, steps_per_epoch=10, warmup_epochs=2, warmup_start=0.1, decay_epochs=[5, 8], decay_factor=0.1)
    assert lr(0) == pytest.approx(0.01)  # warm-up starts at 10 %
    assert lr(10) == pytest.approx(0.01 + 0.09 * 10 / 20)
    assert lr(19) < lr(20) == pytest.approx(0.1)  # peak from the end of warm-up
    assert lr(49) == pytest.approx(0.1) and lr(50) == pytest.approx(0.01)
    assert lr(79) == pytest.approx(0.01) and lr(80) == pytest.approx(0.001)
    assert LearningRate(0.3, 7)(123) == 0.3  # no warm-up, no decay


@pytest.mark.parametrize(
    "argv, words",
    [
        (
            ("local_sgd", "--sync", "ring"),
            "--algo local_sgd: --sync must be one of 'allreduce', 'stragglar', got 'ring'",
        ),
        (
            ("dpsgd", "--sync", "stragglar"),
            "--sync is an option of allreduce_sgd and diloco and local_sgd and wagma, not of dpsgd",
        ),
        (("ensemble_sync", "--sync", "stragglar"), "not of ensemble_sync"),
    ],
)
def test_sync_is_checked_before_anything_runs(argv, words):
    assert words in flags_problem(_args(*argv), 8)


def test_sync_stragglar_reaches_the_three_algorithms_with_a_global_sync():
    for algo in ("allreduce_sgd", "local_sgd", "wagma"):
        assert algorithm_options(_args(algo, "--sync", "stragglar"), 8)["sync"] == "stragglar"


def test_group_size_is_sqrt_p_rounded_up_to_a_power_of_two():
    assert [auto_group_size(p) for p in (1, 2, 4, 8, 16, 32, 64, 1024)] == [1, 2, 2, 4, 4, 8, 8, 32]


def test_group_size_on_any_world_is_sqrt_p_rounded_up_to_the_groups():
    """Other P: as many groups as on the power of two below P (the largest
    power of two <= sqrt(P)), of at least sqrt(P) ranks on average."""
    assert [auto_group_size(p) for p in (3, 5, 6, 7, 12, 24, 48, 1000)] == [3, 2, 3, 3, 6, 6, 12, 62]
    for p in range(2, 257):
        groups = p // auto_group_size(p)
        assert groups & (groups - 1) == 0 and groups * groups <= p < 4 * groups * groups


@pytest.mark.parametrize("algo", ["wagma", "eager_sgd", "adpsgd", "sgp", "dpsgd", "hierarchical_sgd"])
@pytest.mark.parametrize("ranks", [3, 5, 6, 7, 12])
def test_every_algorithm_runs_on_any_rank_count(algo, ranks):
    assert usage_problem(_args(algo), ranks) is None
    assert options_problem(algo, ranks, {"group_size": 3} if algo == "wagma" else {}) is None


@pytest.mark.parametrize(
    "algo, options, ranks, adjusted, said",
    [
        (
            "wagma",
            {"group_size": 8, "tau": 10},
            7,
            {"group_size": 7, "tau": 10},
            ["group_size 8 is more than 7 ranks: 7"],
        ),
        ("wagma", {"group_size": 4}, 7, {"group_size": 4}, []),
        ("wagma", {"group_size": "auto"}, 3, {"group_size": "auto"}, []),
        ("sgp", {"peers": 3}, 4, {"peers": 2}, ["peers 3 is more than max(2, ceil(log2 P)) = 2 on 4 ranks: 2"]),
        (
            "hierarchical_sgd",
            {"period_group_size_dict": {2: 4, 10: 8}, "warmup_steps": 5},
            6,
            {"period_group_size_dict": {2: 3, 10: "P"}, "warmup_steps": 5},
            [
                "period_group_size_dict's group size 4 (period 2) does not divide 6 ranks: 3",
                "period_group_size_dict's last group size 8 (period 10) becomes all 6 ranks ('P')",
            ],
        ),
        (
            "hierarchical_sgd",
            {"period_group_size_dict": {2: 2, 10: "P"}},
            6,
            {"period_group_size_dict": {2: 2, 10: "P"}},
            [],
        ),
        ("hierarchical_sgd", {"period_group_size_dict": "auto"}, 7, {"period_group_size_dict": "auto"}, []),
        ("adpsgd", {}, 7, {}, []),
        ("eager_sgd", {"quorum": "half"}, 5, {"quorum": "half"}, []),
    ],
)
def test_fit_options_adjusts_what_no_longer_fits_a_smaller_world(algo, options, ranks, adjusted, said):
    assert fit_options(algo, options, ranks) == (adjusted, said)
    assert options_problem(algo, ranks, adjusted) is None


def test_fit_options_keeps_every_algorithms_defaults_and_refuses_bad_input():
    for algo in ALGORITHM_NAMES:
        for ranks in (1, 2, 3, 7):
            assert fit_options(algo, {}, ranks) == ({}, [])
            resolved = resolved_options(algo, 8, {}).as_dict()
            fitted, _ = fit_options(algo, resolved, ranks)
            assert options_problem(algo, ranks, fitted) is None
    with pytest.raises(ValueError, match="ranks must be an int >= 1, got 0"):
        fit_options("wagma", {}, 0)
    with pytest.raises(ValueError, match="algorithm must be one of"):
        fit_options("gossip", {}, 4)
    with pytest.raises(ValueError, match="periodd: not an option of local_sgd"):
        fit_options("local_sgd", {"periodd": 3}, 4)
    with pytest.raises(ValueError, match="wagma cannot go on with 4 ranks: tau must be an int >= 1, got 0"):
        fit_options("wagma", {"tau": 0}, 4)


def test_algorithm_options_follow_the_paper_by_default():
    assert algorithm_options(_args("wagma"), 16) == {
        "group_size": 4,
        "tau": 10,
        "wait_avoiding": True,
        "group_averaging": False,
        "fixed_groups": False,
        "reallocate": False,
        "sync": "allreduce",
        "outer_lr": 1.0,
        "outer_momentum": 0.0,
        "outer_nesterov": True,
        "compression": "none",
    }
    assert (
        algorithm_options(_args("wagma", "--no-wait-avoiding", "--group-averaging", "--group-size", "2"), 8)[
            "group_averaging"
        ]
        is True
    )
    assert algorithm_options(_args("local_sgd", "--period", "4"), 8) == {
        "period": 4,
        "reallocate": False,
        "sync": "allreduce",
        "outer_lr": 1.0,
        "outer_momentum": 0.0,
        "outer_nesterov": True,
        "compression": "none",
    }
    # DiLoCo's H = 500 and outer Nesterov momentum (lr 0.7, momentum 0.9), section 3 of the paper;
    # Streaming DiLoCo's H = 100, alpha = 0.5 and an overlap of one step.
    assert algorithm_options(_args("diloco"), 8) == {
        "period": 500,
        "outer_lr": 0.7,
        "outer_momentum": 0.9,
        "outer_nesterov": True,
        "sync": "allreduce",
        "compression": "none",
    }
    assert algorithm_options(_args("streaming_diloco"), 8) == {
        "period": 100,
        "fragments": 2,
        "overlap_steps": 1,
        "mixing": 0.5,
        "outer_lr": 0.7,
        "outer_momentum": 0.9,
        "outer_nesterov": True,
        "compression": "none",
    }
    assert algorithm_options(_args("ensemble_sync"), 8) == {
        "period": 10,
        "timeout_s": 30.0,
        "reallocate": False,
        "compression": "none",
    }
    assert algorithm_options(_args("local_sgd", "--reallocate"), 8)["reallocate"] is True
    assert algorithm_options(_args("hierarchical_sgd"), 16)["period_group_size_dict"] == {2: 4, 10: 16}
    assert algorithm_options(_args("hierarchical_sgd", "--period-group-size-dict", "1:2,5:4,20:P"), 8)[
        "period_group_size_dict"
    ] == {1: 2, 5: 4, 20: 8}
    assert algorithm_options(_args("hierarchical_sgd"), 6)["period_group_size_dict"] == {2: 3, 10: 6}
    assert algorithm_options(_args("sgp"), 8) == {"peers": 1, "compression": "none"}
    # eager-SGD as its authors' code runs it: the majority's random activator,
    # late gradients dropped, the limiter of 32 for solo only.
    assert algorithm_options(_args("eager_sgd"), 8) == {
        "quorum": "majority",
        "late": "drop",
        "limiter": 0,
        "activator_seed": 0,
        "compression": "none",
    }
    assert algorithm_options(_args("eager_sgd", "--quorum", "solo"), 8)["limiter"] == 32
    assert algorithm_options(_args("eager_sgd", "--quorum", "solo", "--limiter", "0"), 8)["limiter"] == 0


@pytest.mark.parametrize(
    "argv, words",
    [
        (["sgp", "--tau", "3"], "--tau is an option of wagma, not of sgp (its options: --peers, --compression)"),
        (
            ["local_sgd", "--tau", "3"],
            "--tau is an option of wagma, not of local_sgd (its options: --period, --reallocate, --sync, --outer-lr, "
            "--outer-momentum, --outer-nesterov, --compression)",
        ),
        (["dpsgd", "--peers", "2"], "--peers is an option of sgp"),
        (["local_sgd", "--batch-size", "0"], "--batch-size must be >= 1"),
        (["local_sgd", "--momentum", "1"], "--momentum must be in [0, 1)"),
        (["local_sgd", "--decay-epochs", "60,30"], "--decay-epochs must be increasing"),
        (["local_sgd", "--resume"], "--resume needs --checkpoint-dir"),
        (
            ["hierarchical_sgd", "--period-group-size-dict", "2:16,4:P"],
            "every group size in --period-group-size-dict must divide 8 ranks (mpiexec -n), got [16, 8]",
        ),
        (
            ["adpsgd", "--reallocate"],
            "--reallocate is an option of ensemble_sync and local_sgd and wagma, not of adpsgd",
        ),
        (["local_sgd", "--timeout-s", "1"], "--timeout-s is an option of ensemble_sync, not of local_sgd"),
        (["sgp", "--fixed-groups"], "--fixed-groups is an option of wagma, not of sgp"),
        (["ensemble_sync", "--checkpoint-dir", "c"], "--checkpoint-dir is not available with --algo ensemble_sync"),
        (["ensemble_sync", "--eval-replicas"], "--eval-replicas is not available with --algo ensemble_sync"),
        (["local_sgd", "--replace", "-1"], "--replace must be >= 0, got -1"),
        (["local_sgd", "--replace-wait", "0"], "--replace-wait must be > 0 seconds, got 0.0"),
    ],
)
def test_usage_problems_name_the_option(argv, words):
    assert words in usage_problem(_args(*argv), 8)


def test_replacements_need_fault_tolerance_a_secret_and_ranks_in_step(monkeypatch):
    """--replace is refused, naming what is missing, where the job was not
    started fault tolerant and where it has no secret; ensemble_sync takes them too."""
    monkeypatch.delenv("OMPI_MCA_mpi_ft_enable", raising=False)
    monkeypatch.delenv("WAGMA_JOB_SECRET", raising=False)
    assert "--replace 2: replacements join through MPI fault tolerance" in usage_problem(
        _args("wagma", "--replace", "2"), 8
    )
    monkeypatch.setenv("OMPI_MCA_mpi_ft_enable", "1")
    assert "--replace 2: the job has no secret" in usage_problem(_args("wagma", "--replace", "2"), 8)
    monkeypatch.setenv("WAGMA_JOB_SECRET", "0" * 64)
    assert usage_problem(_args("wagma", "--replace", "2"), 8) is None
    assert usage_problem(_args("ensemble_sync", "--replace", "1"), 8) is None


@pytest.mark.parametrize(
    "ranks, argv, words",
    [
        (
            2,
            ["wagma", "--group-size", "4"],
            "--group-size must be an int from 1 to 2 ranks (mpiexec -n), or 'auto', got 4",
        ),
        (6, ["wagma", "--group-size", "0"], "--algo wagma: --group-size must be an int from 1 to 6 ranks"),
        (8, ["wagma", "--tau", "0"], "--tau must be an int >= 1, got 0"),
        (8, ["wagma", "--no-wait-avoiding", "--group-averaging", "--group-size", "9"], "--group-size"),
        (8, ["local_sgd", "--period", "0"], "--algo local_sgd: --period must be an int >= 1"),
        (
            8,
            ["wagma", "--no-wait-avoiding", "--fixed-groups"],
            "--algo wagma: --fixed-groups needs --wait-avoiding or --group-averaging: with both off no groups average",
        ),
        (8, ["wagma", "--group-averaging"], "--wait-avoiding and --group-averaging cannot both be on"),
        (8, ["eager_sgd", "--quorum", "all"], "--quorum must be one of 'solo', 'majority', 'half', got 'all'"),
        (8, ["eager_sgd", "--late", "keep"], "--late must be one of 'drop', 'newest', 'accumulate', got 'keep'"),
        (8, ["eager_sgd", "--activator-seed", "-3"], "--activator-seed must be an int >= 0, got -3"),
        (
            8,
            ["sgp", "--peers", "4"],
            "--peers must be an int from 1 to max(2, ceil(log2 P)) = 3 on 8 ranks (mpiexec -n), got 4",
        ),
        (8, ["allreduce_sgd", "--bucket-cap-mb", "0"], "--bucket-cap-mb must be a number above 0"),
        (
            8,
            ["hierarchical_sgd", "--period-group-size-dict", "2:3,4:P"],
            "every group size in --period-group-size-dict must divide 8 ranks (mpiexec -n), got [3, 8]",
        ),
        (
            8,
            ["hierarchical_sgd", "--period-group-size-dict", "4:2,2:P"],
            "--period-group-size-dict's periods must be increasing",
        ),
        (
            8,
            ["hierarchical_sgd", "--period-group-size-dict", "2:2,4:4"],
            "the last group size in --period-group-size-dict must be all 8 ranks (mpiexec -n) ('P')",
        ),
        (4, ["ensemble_sync", "--period", "0"], "--algo ensemble_sync: --period must be an int >= 1, got 0"),
        (4, ["ensemble_sync", "--timeout-s", "0"], "--timeout-s must be a number above 0, got 0.0"),
        (4, ["ensemble_sync", "--timeout-s", "-2"], "--timeout-s must be a number above 0, got -2.0"),
    ],
)
def test_algorithm_problems_are_found_before_set_up_in_the_command_lines_words(ranks, argv, words):
    """The algorithms' own checks (the options objects', the ones their constructors
    run) on the options the flags make, for the world size, with no model built;
    the messages name the flags and the launcher's -n, not Python keywords."""
    problem = usage_problem(_args(*argv), ranks)
    assert problem is not None and words in problem, problem
    assert not any(
        keyword in problem
        for keyword in (
            "group_size",
            "world_size",
            "world size",
            "period_group",
            "wait_avoiding",
            "fixed_groups",
            "timeout_s",
        )
    )


@pytest.mark.parametrize(
    "argv, words",
    [
        (["wagma", "--group-size", "big"], "argument --group-size: expected an int or 'auto', got 'big'"),
        (["eager_sgd", "--limiter", "-1"], "argument --limiter: expected an int or 'auto', got '-1'"),
        (["hierarchical_sgd", "--period-group-size-dict", "2-4"], "expected PERIOD:SIZE[,PERIOD:SIZE...]"),
    ],
)
def test_option_values_the_flags_cannot_read_are_parse_errors(argv, words, capsys):
    with pytest.raises(SystemExit):
        _args(*argv)
    assert words in capsys.readouterr().err


def test_every_option_has_one_flag_of_its_own_name():
    """The command line's names are the library's: --NAME-WITH-DASHES, a
    switch as --NAME/--no-NAME, and its help text from the options object."""
    parser = build_parser()
    flags = {option for action in parser._actions for option in action.option_strings}
    for cls in OPTIONS.values():
        for name, field in cls.fields().items():
            flag = "--" + name.replace("_", "-")
            assert flag in flags, flag
            if isinstance(field.default, bool):
                assert "--no-" + name.replace("_", "-") in flags
    help_text = " ".join(parser.format_help().split())
    assert "wagma: S, the butterfly group size" in help_text
    assert "local_sgd: tau: steps between model averages" in help_text
    assert "ensemble_sync: T, local steps between synchronizations. [10]" in help_text


def test_library_and_command_line_problems_come_from_one_check():
    assert options_problem("local_sgd", 8, {"period": 0}) == "period must be an int >= 1, got 0"
    assert (
        flags_problem(_args("local_sgd", "--period", "0"), 8) == "--algo local_sgd: --period must be an int >= 1, got 0"
    )
    assert (
        options_problem("local_sgd", 8, {"tau": 4})
        == "tau: not an option of local_sgd; its options: period, reallocate, sync, outer_lr, outer_momentum, "
        "outer_nesterov, compression"
    )


def test_the_algorithm_names_are_the_registrys():
    assert ALGORITHM_NAMES == tuple(sorted(ALGORITHMS))


def test_help_imports_neither_torch_nor_mpi():
    probe = (
        "import sys\nfrom experiments.train import main\ntry:\n    main(['--help'])\n"
        "except SystemExit as exc:\n    assert exc.code == 0\n"
        "print(sorted(m for m in ('torch', 'mpi4py.MPI') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-1] == "[]"


def test_a_good_command_line_has_no_problem():
    assert usage_problem(_args("wagma", "--tau", "5", "--group-size", "4"), 8) is None


def test_fixed_groups_reach_wagma_on_both_group_paths():
    """--fixed-groups (WAGMA's ablation 2) is off unless given, and goes with
    the wait-avoiding groups (alpha, the default) or the blocking ones (beta)."""
    assert algorithm_options(_args("wagma", "--fixed-groups"), 8)["fixed_groups"] is True
    beta = algorithm_options(_args("wagma", "--no-wait-avoiding", "--group-averaging", "--fixed-groups"), 8)
    assert (beta["wait_avoiding"], beta["group_averaging"], beta["fixed_groups"]) == (False, True, True)
    assert usage_problem(_args("wagma", "--fixed-groups"), 8) is None
    assert usage_problem(_args("wagma", "--no-wait-avoiding", "--group-averaging", "--fixed-groups"), 8) is None
    assert options_problem("wagma", 8, {"fixed_groups": 1}) == "fixed_groups must be True or False, got 1"
    assert "fixed_groups needs" in options_problem("wagma", 8, {"wait_avoiding": False, "fixed_groups": True})
