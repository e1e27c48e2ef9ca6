"""The command-line flags of the algorithms' options, made from the options objects (no torch, no MPI)."""

from __future__ import annotations

import argparse
import dataclasses
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from . import ALGORITHM_NAMES, COMMAND_LINE, OPTIONS, options_problem

__all__ = ["add_algorithm_flags", "flags_problem", "options_from_args"]


def _fields_by_name() -> dict[str, list[tuple[str, dataclasses.Field]]]:
    """Each option name -> [(algorithm, field)] of the algorithms that have it."""
    by_name: defaultdict[str, list[tuple[str, dataclasses.Field]]] = defaultdict(list)
    for algorithm in ALGORITHM_NAMES:
        for name, f in OPTIONS[algorithm].fields().items():
            by_name[name].append((algorithm, f))
    return by_name


def _help(owners: Iterable[tuple[str, dataclasses.Field]]) -> str:
    """One flag's help: its documentation for each algorithm that has it,
    with that algorithm's default in brackets (identical texts once)."""
    texts: defaultdict[tuple[str, str], list[str]] = defaultdict(list)
    for algorithm, f in owners:
        default = f.default if not isinstance(f.default, bool) else ("on" if f.default else "off")
        texts[(f.metadata["help"], str(default))].append(algorithm)
    return "; ".join(f"{', '.join(algorithms)}: {text} [{default}]" for (text, default), algorithms in texts.items())


def add_algorithm_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per option name, ``--NAME-WITH-DASHES`` (booleans also
    ``--no-NAME``), its help from each algorithm's documentation; the
    parsed value is None when the flag is not given."""
    g = parser.add_argument_group("algorithm options (each algorithm's own; default: the paper's)")
    for name, owners in _fields_by_name().items():
        f = owners[0][1]
        flag = COMMAND_LINE(name)
        if isinstance(f.default, bool):
            g.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=_help(owners))
        else:
            g.add_argument(
                flag,
                dest=name,
                type=f.metadata["parse"] or type(f.default),
                default=None,
                metavar=f.metadata["metavar"],
                help=_help(owners),
            )


def options_from_args(args: argparse.Namespace, algorithm: str) -> dict[str, Any]:
    """The keywords of ``create(algorithm, ...)`` that the flags of ``args`` give
    (the flags not given are left out: the options object has their defaults)."""
    return {name: getattr(args, name) for name in OPTIONS[algorithm].fields() if getattr(args, name, None) is not None}


def flags_problem(args: argparse.Namespace, ranks: int) -> str | None:
    """The first problem with the algorithm flags of ``args`` (``args.algo``)
    on ``ranks`` ranks, in the command line's words, or None: a flag of
    another algorithm, then the options object's checks."""
    fields = OPTIONS[args.algo].fields()
    for name, owners in _fields_by_name().items():
        if name not in fields and getattr(args, name, None) is not None:
            own = ", ".join(COMMAND_LINE(n) for n in fields) or "none"
            return (
                f"{COMMAND_LINE(name)} is an option of {' and '.join(a for a, _ in owners)}, not of "
                f"{args.algo} (its options: {own})"
            )
    problem = options_problem(args.algo, ranks, options_from_args(args, args.algo), COMMAND_LINE)
    return None if problem is None else f"--algo {args.algo}: {problem}"
