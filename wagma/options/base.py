"""The machinery of the algorithms' options objects: fields that carry their documentation and check."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self is Python 3.11's

__all__ = ["COMMAND_LINE", "LIBRARY", "Options", "Wording", "keyword_signature", "option", "options_of"]


@dataclass(frozen=True)
class Wording:
    """How a problem sentence names an option and the rank count: the
    library's keyword (``group_size``, "8 ranks") or the command line's flag
    (``--group-size``, "8 ranks (mpiexec -n)"), so that each check is
    written once and speaks the words of whoever wrote the value."""

    flags: bool

    def __call__(self, name: str) -> str:
        return "--" + name.replace("_", "-") if self.flags else name

    def ranks(self, count: int) -> str:
        return f"{count} ranks (mpiexec -n)" if self.flags else f"{count} ranks"


#: Problems in the words of ``create(...)``'s keywords.
LIBRARY = Wording(flags=False)
#: Problems in the words of ``experiments.train``'s and ``wagma.sim``'s flags.
COMMAND_LINE = Wording(flags=True)

#: ``check(value, name, ranks, say)``, returning a problem sentence or None; ``name``
#: is the option as the user wrote it (``say(field)``).
Check = Callable[[Any, str, int, Wording], "str | None"]


def option(
    default: Any,
    *,
    help: str,
    check: Check | None = None,
    parse: Callable[[str], Any] | None = None,
    metavar: str | None = None,
) -> Any:
    """A field of an :class:`Options` dataclass.

    Args:
        default: the value when the option is not given (every option has
            one; "auto" values are made concrete for the rank count by
            :meth:`Options.resolve`).
        help: the option's documentation, for the docstring and ``--help``.
        check: ``check(value, name, ranks, say)`` -> a problem sentence or None.
        parse: the command line's text -> the value (default: the type of
            ``default``; booleans become ``--NAME/--no-NAME``).
        metavar: the flag's argument in ``--help``.
    """
    return dataclasses.field(
        default=default, metadata={"help": help, "check": check, "parse": parse, "metavar": metavar}
    )


@dataclass(frozen=True)
class Options:
    """The options of one algorithm: names, defaults, documentation, checks.

    Subclasses are made by :func:`options_of` (a frozen dataclass whose
    fields come from :func:`option`) and may override :meth:`ranks_problem`
    (rank counts the algorithm cannot run on), ``_relations`` (checks
    between fields), :meth:`resolve` ("auto" values for a rank count) and
    :meth:`fit` (values chosen for another rank count, adjusted).
    The algorithm class's keywords, the command line's flags
    (:mod:`wagma.options.cli`), the simulator's checks and the run file's
    ``algorithm_options`` all come from here.  Pure: no torch, no MPI.
    """

    algorithm: ClassVar[str] = ""

    @classmethod
    def fields(cls) -> dict[str, dataclasses.Field]:
        """The options by name, in declaration order."""
        return {f.name: f for f in dataclasses.fields(cls)}

    @classmethod
    def keyword_problem(cls, keywords: Iterable[str], say: Wording = LIBRARY) -> str | None:
        """The keywords this algorithm does not have, with the ones it has, or None."""
        unknown = [k for k in keywords if k not in cls.fields()]
        if not unknown:
            return None
        accepted = ", ".join(say(n) for n in cls.fields()) or "none"
        return f"{', '.join(say(k) for k in unknown)}: not an option of {cls.algorithm}; its options: {accepted}"

    def problem(self, ranks: int, say: Wording = LIBRARY) -> str | None:
        """The first problem with these options on ``ranks`` ranks, or None:
        the rank count, each field's own check, then ``_relations``."""
        problem = self.ranks_problem(ranks, say)
        for name, f in self.fields().items():
            check = f.metadata["check"]
            if problem is None and check is not None:
                problem = check(getattr(self, name), say(name), ranks, say)
        return problem or self._relations(ranks, say)

    def ranks_problem(self, ranks: int, say: Wording) -> str | None:
        """Why the algorithm cannot run on ``ranks`` ranks, or None."""
        return None

    def _relations(self, ranks: int, say: Wording) -> str | None:
        """Problems between fields, checked after each field's own."""
        return None

    def resolve(self, ranks: int) -> "Self":
        """These options with "auto" values made concrete for ``ranks``
        ranks: the values a run uses and records.  Call after
        :meth:`~wagma.options.base.Options.problem`."""
        return self

    def fit(self, ranks: int) -> "tuple[Self, list[str]]":
        """These options adjusted to run on ``ranks`` ranks where a value
        chosen for more (or other) ranks no longer fits, and one sentence per
        value changed, naming the option, its value and the new one.  Values
        that fit stay as they are, "auto" ones too
        (:meth:`~wagma.options.base.Options.resolve` makes them concrete for
        any rank count)."""
        return self, []

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.fields()}


#: An :class:`Options` subclass, which :func:`options_of` completes and hands back.
OptionsT = TypeVar("OptionsT", bound=Options)


def options_of(algorithm: str) -> Callable[[type[OptionsT]], type[OptionsT]]:
    """Class decorator: a frozen :class:`Options` dataclass for
    ``algorithm``, its docstring completed by an ``Args:`` section of the
    fields' documentation and defaults."""

    def make(cls: type[OptionsT]) -> type[OptionsT]:
        cls = dataclass(frozen=True)(cls)
        cls.algorithm = algorithm
        args = [f"    {f.name}: {f.metadata['help']} Default ``{f.default!r}``." for f in dataclasses.fields(cls)]
        cls.__doc__ = (
            (cls.__doc__ or "").rstrip() + "\n\n" + ("Args:\n" + "\n".join(args) if args else "It has no options.")
        )
        return cls

    return make


def keyword_signature(options: type[Options], leading: list[inspect.Parameter]) -> inspect.Signature:
    """A constructor's signature: ``leading`` parameters, then the options
    as keyword-only parameters with their defaults (what ``help()`` and
    editors show for an algorithm class)."""
    return inspect.Signature(
        [
            *leading,
            *(
                inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=f.default)
                for name, f in options.fields().items()
            ),
        ]
    )
