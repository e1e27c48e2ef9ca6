"""The algorithms' options: one object per algorithm, from which keywords, flags, checks and records come."""

from __future__ import annotations

from .algorithms import ALGORITHM_NAMES, OPTIONS, SYNCS, AlgorithmName, Auto, Sync, auto_group_size
from .base import COMMAND_LINE, LIBRARY, Options, Wording, option

__all__ = [
    "ALGORITHM_NAMES",
    "AlgorithmName",
    "Auto",
    "COMMAND_LINE",
    "LIBRARY",
    "OPTIONS",
    "Options",
    "SYNCS",
    "Sync",
    "Wording",
    "auto_group_size",
    "option",
    "options_problem",
    "resolved_options",
]


def _name_problem(name):
    if name not in OPTIONS:
        return f"algorithm must be one of {', '.join(map(repr, ALGORITHM_NAMES))}, got {name!r}"
    return None


def options_problem(name: str, ranks: int, keywords: dict, say: Wording = LIBRARY) -> str | None:
    """The first problem with running algorithm ``name`` with ``keywords``
    on ``ranks`` ranks, as a sentence in ``say``'s words, or None.  Pure (no
    model, no MPI): every rank finds the same problem in the same input."""
    problem = _name_problem(name) or OPTIONS[name].keyword_problem(keywords, say)
    if problem:
        return problem
    return OPTIONS[name](**keywords).problem(ranks, say)


def resolved_options(name: str, ranks: int, keywords: dict, say: Wording = LIBRARY) -> Options:
    """Algorithm ``name``'s options object for ``keywords`` on ``ranks``
    ranks, its "auto" values made concrete.

    Raises:
        ValueError: the problem :func:`options_problem` finds.
    """
    problem = options_problem(name, ranks, keywords, say)
    if problem:
        raise ValueError(problem)
    return OPTIONS[name](**keywords).resolve(ranks)
