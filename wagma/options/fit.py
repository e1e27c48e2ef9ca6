"""The options of an algorithm adjusted to a new rank count (the survivors of a dead rank)."""

from typing import Any

from . import _name_problem, options_problem
from .algorithms import OPTIONS

__all__ = ["fit_options"]


def fit_options(algorithm: str, options: dict[str, Any], ranks: int) -> tuple[dict[str, Any], list[str]]:
    """Algorithm ``algorithm``'s ``options`` (keywords, some or all of them,
    e.g. resolved for the job's first rank count) adjusted to run on
    ``ranks`` ranks, and a sentence per adjustment.

    For a job whose rank count changed (ranks that died, survivors that go
    on): a value chosen for the old count that no longer fits the new one
    is replaced by the nearest that does, and every other value is kept.
    The rules (each options class's :meth:`~wagma.options.base.Options.fit`):
    WAGMA-SGD's ``group_size`` above ``ranks`` becomes ``ranks``; SGP's
    ``peers`` above max(2, ceil(log2 P)) becomes that; hierarchical SGD's
    group sizes that do not divide ``ranks`` become the largest divisor
    below them, and its last level all ranks (``"P"``).  Every algorithm
    runs on any rank count >= 1 (WAGMA-SGD's groups,
    :class:`~collectives.wait_avoiding.groups.ButterflyGrouping`; AD-PSGD's
    odd rings, :func:`~collectives.gossip.is_active`), so no other option
    depends on it; "auto" values stay "auto".  Pure: every survivor makes
    the same adjustments from the same input.

    Returns:
        ``(adjusted, adjustments)``: the keywords given, with the values
        changed, and one sentence per change (empty when all fit).

    Raises:
        ValueError: an unknown algorithm or option, ``ranks`` < 1, or a
            problem no adjustment for the rank count mends (named as
            :func:`~wagma.options.options_problem` names it); the same on
            every survivor, since it depends on the options and the count
            alone.
    """
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise ValueError(f"ranks must be an int >= 1, got {ranks!r}")
    problem = _name_problem(algorithm) or OPTIONS[algorithm].keyword_problem(options)
    if problem:
        raise ValueError(problem)
    given = OPTIONS[algorithm](**options)
    fitted, adjustments = given.fit(ranks)
    changed = {name: value for name, value in fitted.as_dict().items() if value != getattr(given, name)}
    adjusted = {**options, **changed}
    problem = options_problem(algorithm, ranks, adjusted)
    if problem:
        raise ValueError(f"{algorithm} cannot go on with {ranks} ranks: {problem}")
    return adjusted, adjustments
