"""The training command line's checks and the learning-rate schedule (no MPI)."""

import pytest

from experiments.options import algorithm_options, auto_group_size, build_parser, usage_problem
from experiments.schedule import LearningRate


def _args(*argv):
    return build_parser().parse_args(["--algo", *argv])


def test_warm_up_then_step_decay():
    lr = LearningRate(0.1, steps_per_epoch=10, warmup_epochs=2, warmup_start=0.1,
                      decay_epochs=[5, 8], decay_factor=0.1)
    assert lr(0) == pytest.approx(0.01)                 # warm-up starts at 10 %
    assert lr(10) == pytest.approx(0.01 + 0.09 * 10 / 20)
    assert lr(19) < lr(20) == pytest.approx(0.1)       # peak from the end of warm-up
    assert lr(49) == pytest.approx(0.1) and lr(50) == pytest.approx(0.01)
    assert lr(79) == pytest.approx(0.01) and lr(80) == pytest.approx(0.001)
    assert LearningRate(0.3, 7)(123) == 0.3             # no warm-up, no decay


def test_group_size_is_sqrt_p_rounded_up_to_a_power_of_two():
    assert [auto_group_size(p) for p in (1, 2, 4, 8, 16, 32, 64, 1024)] == [1, 2, 2, 4, 4, 8, 8, 32]


def test_algorithm_options_follow_the_paper_by_default():
    assert algorithm_options(_args("wagma"), 16) == {"group_size": 4, "tau": 10, "wait_avoiding": True,
                                                     "group_averaging": False}
    assert algorithm_options(_args("wagma", "--no-wait-avoiding", "--group-averaging", "--group-size", "2"),
                             8)["group_averaging"] is True
    assert algorithm_options(_args("local_sgd", "--tau", "4"), 8) == {"period": 4}
    assert algorithm_options(_args("hierarchical_sgd"), 16)["period_group_size_dict"] == {2: 4, 10: 16}
    assert algorithm_options(_args("hierarchical_sgd", "--levels", "1:2,5:4,20:P"), 8)[
        "period_group_size_dict"] == {1: 2, 5: 4, 20: 8}
    assert algorithm_options(_args("sgp"), 8) == {"peers": 1}


@pytest.mark.parametrize("argv, words", [
    (["sgp", "--tau", "3"], "--tau is an option of wagma and local_sgd, not of sgp"),
    (["dpsgd", "--peers", "2"], "--peers is an option of sgp"),
    (["wagma", "--group-size", "big"], "--group-size must be a power of two or 'auto'"),
    (["local_sgd", "--batch-size", "0"], "--batch-size must be >= 1"),
    (["local_sgd", "--momentum", "1"], "--momentum must be in [0, 1)"),
    (["local_sgd", "--decay-epochs", "60,30"], "--decay-epochs must be increasing"),
    (["local_sgd", "--resume"], "--resume needs --checkpoint-dir"),
    (["hierarchical_sgd", "--levels", "2:16,4:P"], "--levels group size 16 exceeds the 8 ranks"),
])
def test_usage_problems_name_the_option(argv, words):
    assert words in usage_problem(_args(*argv), 8)


def test_a_good_command_line_has_no_problem():
    assert usage_problem(_args("wagma", "--tau", "5", "--group-size", "4"), 8) is None
