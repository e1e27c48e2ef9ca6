"""The checks options share: integers from a bound, positive numbers, switches, choices."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .base import Check, Wording

__all__ = ["boolean", "int_at_least", "number_in", "one_of", "positive_number"]


def int_at_least(low: int) -> Check:
    """A check: an int (not a bool) >= ``low``."""

    def check(value: object, name: str, ranks: int, say: Wording) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            return f"{name} must be an int >= {low}, got {value!r}"
        return None

    return check


def positive_number(value: object, name: str, ranks: int, say: Wording) -> str | None:
    """A check: an int or float above 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        return f"{name} must be a number above 0, got {value!r}"
    return None


def number_in(low: float, high: float, *, high_included: bool) -> Check:
    """A check: an int or float from ``low`` (included) to ``high``."""
    top = "]" if high_included else ")"

    def check(value: object, name: str, ranks: int, say: Wording) -> str | None:
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not (low <= value <= high if high_included else low <= value < high)
        ):
            return f"{name} must be a number in [{low:g}, {high:g}{top}, got {value!r}"
        return None

    return check


def boolean(value: object, name: str, ranks: int, say: Wording) -> str | None:
    """A check: True or False."""
    if not isinstance(value, bool):
        return f"{name} must be True or False, got {value!r}"
    return None


def one_of(*choices: object) -> Check:
    """A check: one of ``choices``."""

    def check(value: object, name: str, ranks: int, say: Wording) -> str | None:
        if value not in choices or isinstance(value, bool):
            return f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}"
        return None

    return check
