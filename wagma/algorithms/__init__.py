"""Training algorithms by name: one interface, driven by ``step()`` after ``backward()``."""

import inspect

from collectives.agreement import agree

from .adpsgd import ADPSGD
from .allreduce_sgd import AllreduceSGD
from .base import Algorithm
from .dpsgd import DPSGD
from .eager_sgd import EagerSGD
from .ensemble_sync import EnsembleSync
from .hierarchical_sgd import HierarchicalSGD
from .local_sgd import LocalSGD
from .sgp import SGP
from .wagma_sgd import WagmaSGD

__all__ = ["ADPSGD", "ALGORITHMS", "Algorithm", "AllreduceSGD", "DPSGD", "EagerSGD", "EnsembleSync", "HierarchicalSGD",
           "LocalSGD",
           "REQUIRED", "SGP", "WagmaSGD", "create", "option_defaults", "options_problem"]

#: Algorithms by the name the CLI and the Slurm scripts use.
ALGORITHMS = {cls.name: cls for cls in (ADPSGD, AllreduceSGD, DPSGD, EagerSGD, EnsembleSync, HierarchicalSGD,
                                          LocalSGD, SGP, WagmaSGD)}


#: The default of an option that has none (a required option).
REQUIRED = inspect.Parameter.empty


def option_defaults(name) -> dict:
    """Algorithm ``name``'s options (the keyword-only arguments of its class)
    and their defaults, :data:`REQUIRED` where there is none."""
    return {p.name: p.default for p in inspect.signature(ALGORITHMS[name]).parameters.values()
            if p.kind is p.KEYWORD_ONLY}


def _name_or_keyword_problem(name, options):
    if name not in ALGORITHMS:
        return f"algorithm must be one of {', '.join(map(repr, ALGORITHMS))}, got {name!r}"
    accepted = list(option_defaults(name))
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        return (f"unknown option {', '.join(map(repr, unknown))} for {name}; "
                f"accepted: {', '.join(accepted) or 'none'}")
    return None


def options_problem(name, world_size, **options):
    """The first problem with running algorithm ``name`` with ``options`` on
    ``world_size`` ranks, as a sentence naming the keyword, or None.

    Pure (no model, no MPI): a command line can be checked with it before
    anything is built.  Checks the name (the message lists the known ones),
    unknown and missing keywords, and the algorithm's own
    :meth:`~wagma.algorithms.Algorithm.check_options` on the options with
    their defaults filled in.
    """
    problem = _name_or_keyword_problem(name, options)
    if problem:
        return problem
    accepted = list(option_defaults(name))
    defaults = {k: v for k, v in option_defaults(name).items() if v is not REQUIRED}
    missing = sorted(set(accepted) - set(defaults) - set(options))
    if missing:
        return f"{name} needs the option {', '.join(missing)}"
    return ALGORITHMS[name].check_options(world_size, **{**defaults, **options})


def create(name, model, optimizer, comm, **options) -> Algorithm:
    """Build the algorithm called ``name``; collective over ``comm``.

    Raises:
        ValueError: on every rank, when any rank names an unknown algorithm
            (the message lists the known ones) or passes bad options.
    """
    problem = _name_or_keyword_problem(name, options)
    agree(comm, "wagma.algorithms.create", problem, ValueError, algorithm=name)
    return ALGORITHMS[name](model, optimizer, comm, **options)
