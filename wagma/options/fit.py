"""The options of an algorithm rebuilt on the survivors of a dead rank."""

from typing import Any

from . import options_problem

__all__ = ["fit_options"]


def fit_options(algorithm: str, options: dict[str, Any], ranks: int) -> tuple[dict[str, Any], list[str]]:
    """``options`` (resolved for the job's first rank count) for ``ranks``
    survivors, and the adjustments made, in words: none, the options kept
    as they are where they fit.

    Raises:
        ValueError: an option no longer fits ``ranks`` (a group size above
            the survivors, a rank count the groups cannot take); the same
            on every survivor, since it depends on the options and the
            count alone.
    """
    problem = options_problem(algorithm, ranks, options)
    if problem:
        raise ValueError(f"{algorithm} cannot go on with {ranks} survivors: {problem}")
    return options, []
