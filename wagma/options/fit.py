"""(temporary until the any-P options land) Options fitted to a smaller rank count."""

from typing import Any

from . import options_problem


def fit_options(algorithm: str, options: dict[str, Any], ranks: int) -> tuple[dict[str, Any], list[str]]:
    problem = options_problem(algorithm, ranks, options)
    if problem:
        raise ValueError(problem)
    return options, []
