"""Butterfly groups of WAGMA-SGD: which ranks average together at each iteration."""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import SupportsIndex

__all__ = [
    "ButterflyGrouping",
    "butterfly_groups",
    "butterfly_masks",
    "butterfly_partners",
    "check_group_size",
    "group_of",
    "is_power_of_two",
]


def is_power_of_two(n: object) -> bool:
    """Whether ``n`` is an integer power of two (1, 2, 4, ...).

    Anything that is not an integer (``bool`` and ``float`` included) answers ``False``.
    """
    if isinstance(n, bool) or not isinstance(n, SupportsIndex):
        return False
    try:
        n = operator.index(n)
    except TypeError:
        return False
    return n > 0 and n & (n - 1) == 0


def _as_int(name: str, value: object) -> int:
    """``value`` as a plain ``int``; ``TypeError`` naming ``name`` if it is not an integer."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got bool {value!r}")
    try:
        if not isinstance(value, SupportsIndex):
            raise TypeError
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}") from None


def check_group_size(world_size: int, group_size: int) -> None:
    """Check that ``world_size`` and ``group_size`` admit butterfly groups.

    Both must be powers of two and ``1 <= group_size <= world_size``.

    Raises:
        TypeError: either argument is not an integer (``bool`` is not accepted).
        ValueError: a size is out of range; the message names the parameter, its value
            and the accepted values.
    """
    world_size = _as_int("world_size", world_size)
    group_size = _as_int("group_size", group_size)
    if not is_power_of_two(world_size):
        raise ValueError(f"world_size must be a power of two (butterfly groups need a hypercube), got {world_size}")
    if not is_power_of_two(group_size) or group_size > world_size:
        raise ValueError(f"group_size must be a power of two <= world size {world_size}, got {group_size}")


def _log2(n: int) -> int:
    return n.bit_length() - 1


@dataclass(frozen=True)
class ButterflyGrouping:
    """Dynamic butterfly grouping of WAGMA-SGD (Li et al., IEEE TPDS 2021, Algorithm 1).

    At iteration ``t`` the ``world_size`` = P ranks split into P / S disjoint groups of
    ``group_size`` = S ranks that average together. The groups are built by log2 S
    butterfly phases: ``shift = (t * log2 S) mod log2 P``; each phase pairs rank ``p``
    with ``p ^ (1 << shift)`` and then sets ``shift = (shift + 1) mod log2 P``. The
    groups are the connected components of these pairings, i.e. the ranks reachable
    from a rank by xor with any subset of the phase masks. The group allreduce runs
    the same phases as a butterfly (recursive doubling).

    Reading of the paper: Algorithm 1 writes ``mask <<= shift`` (shifting the running
    mask). Read literally this gives wrong groups (P = 8, S = 4, t = 1 would give masks
    4, 4 and groups of two). We follow the paper's own worked example instead, which
    needs ``mask = 1 << shift`` in each phase: P = 8, S = 4 gives {0,1,2,3},{4,5,6,7}
    at t = 0 and {0,1,4,5},{2,3,6,7} at t = 1.

    Successive iterations use consecutive hypercube dimensions (cyclically), so the
    groups change every iteration when 1 < S < P; S = 1 and S = P give the same groups
    at every iteration. Construction only validates; it runs no collective.

    With ``dynamic=False`` every iteration uses iteration 0's groups (the same log2 S
    dimensions, masks 1, 2, ..., S / 2: blocks of S consecutive ranks). That is the
    paper's ablation 2 (section 5.2, experiment 2: "group model averaging without
    using the dynamic grouping strategy (i.e., the groups are fixed)"; ResNet-50's
    top-1 accuracy "drops to 72.2%"): for 1 < S < P an update never leaves its group
    between the global averages.

    Args:
        world_size: number of ranks P, a power of two (1 is allowed: one group, no phases).
        group_size: ranks per group S, a power of two with 1 <= S <= P.
        dynamic: Algorithm 1's groups, which change with t (default); False: iteration
            0's groups at every iteration.

    Example::

        >>> ButterflyGrouping(8, 4).groups(1)
        [[0, 1, 4, 5], [2, 3, 6, 7]]
    """

    world_size: int
    group_size: int
    dynamic: bool = True

    def __post_init__(self) -> None:
        check_group_size(self.world_size, self.group_size)
        if not isinstance(self.dynamic, bool):
            raise TypeError(f"dynamic must be True or False, got {self.dynamic!r}")
        # Normalise integer-like values (e.g. numpy integers) to plain ints.
        object.__setattr__(self, "world_size", operator.index(self.world_size))
        object.__setattr__(self, "group_size", operator.index(self.group_size))

    @property
    def num_phases(self) -> int:
        """Butterfly phases per iteration (log2 S), the exchanges inside a group allreduce."""
        return _log2(self.group_size)

    @property
    def iterations_to_connect(self) -> int | None:
        """Fewest consecutive iterations whose groups together connect all ranks.

        Each iteration covers log2 S consecutive hypercube dimensions (cyclically), so
        any ``ceil(log2 P / log2 S)`` consecutive iterations cover all log2 P of them and
        an update reaches every rank; fewer never do. Degenerate cases: 0 for P = 1
        (one rank is already connected), 1 for S = P, and ``None`` for S = 1 < P
        (singleton groups never mix; only the periodic global allreduce connects ranks)
        and for fixed groups (``dynamic=False``) with S < P.
        """
        global_phases = _log2(self.world_size)
        if global_phases == 0:
            return 0
        if self.num_phases == 0 or (not self.dynamic and self.num_phases < global_phases):
            return None
        return math.ceil(global_phases / self.num_phases)

    def masks(self, t: int) -> tuple[int, ...]:
        """The xor mask of each butterfly phase of iteration ``t`` (``num_phases`` of them;
        iteration 0's at every ``t`` when not :attr:`dynamic`)."""
        t = _as_int("t", t)
        if t < 0:
            raise ValueError(f"t must be a non-negative iteration number, got {t}")
        global_phases = _log2(self.world_size)
        if global_phases == 0:
            return ()
        shift = (t * self.num_phases) % global_phases if self.dynamic else 0
        masks = []
        for _ in range(self.num_phases):
            masks.append(1 << shift)
            shift = (shift + 1) % global_phases
        return tuple(masks)

    def _check_rank(self, rank: int) -> int:
        rank = _as_int("rank", rank)
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank must be in range(world_size) = range({self.world_size}), got {rank}")
        return rank

    def partners(self, t: int, rank: int) -> tuple[int, ...]:
        """The partner of ``rank`` in each butterfly phase of iteration ``t`` (``rank ^ mask``)."""
        rank = self._check_rank(rank)
        return tuple(rank ^ mask for mask in self.masks(t))

    def group_of(self, t: int, rank: int) -> list[int]:
        """The sorted group of S ranks that ``rank`` averages with at iteration ``t``."""
        rank = self._check_rank(rank)
        span = sum(self.masks(t))  # distinct single-bit masks: their sum is their union
        return _span_members(rank & ~span, span)

    def groups(self, t: int) -> list[list[int]]:
        """All P / S groups of iteration ``t``: sorted lists of ranks, sorted by first rank."""
        span = sum(self.masks(t))
        return [_span_members(base, span) for base in range(self.world_size) if base & span == 0]


def _span_members(base: int, span: int) -> list[int]:
    """Sorted ``base | sub`` over every sub-bitmask ``sub`` of ``span`` (``base & span == 0``)."""
    members = []
    sub = span
    while True:
        members.append(base | sub)
        if sub == 0:
            break
        sub = (sub - 1) & span
    members.reverse()  # sub-bitmasks were enumerated in decreasing order
    return members


def butterfly_groups(P: int, S: int, t: int) -> list[list[int]]:
    """Groups of S ranks (out of P) that average together at iteration ``t``.

    See :class:`ButterflyGrouping` (WAGMA-SGD, Li et al., IEEE TPDS 2021, Algorithm 1).
    """
    return ButterflyGrouping(P, S).groups(t)


def butterfly_masks(P: int, S: int, t: int) -> tuple[int, ...]:
    """The xor mask of each of the log2 S butterfly phases of iteration ``t``."""
    return ButterflyGrouping(P, S).masks(t)


def butterfly_partners(P: int, S: int, t: int, rank: int) -> tuple[int, ...]:
    """The partner of ``rank`` in each butterfly phase of iteration ``t``."""
    return ButterflyGrouping(P, S).partners(t, rank)


def group_of(P: int, S: int, t: int, rank: int) -> list[int]:
    """The group of S ranks containing ``rank`` at iteration ``t``."""
    return ButterflyGrouping(P, S).group_of(t, rank)
