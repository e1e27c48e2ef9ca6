"""Butterfly groups of WAGMA-SGD: which ranks average together at each iteration."""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import SupportsIndex

__all__ = [
    "ButterflyGrouping",
    "GroupPlan",
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
    if type(value) is int:  # the common case, without the protocol check's cost
        return value
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got bool {value!r}")
    try:
        if not isinstance(value, SupportsIndex):
            raise TypeError
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}") from None


def check_group_size(world_size: int, group_size: int) -> None:
    """Check that ``world_size`` and ``group_size`` admit butterfly groups:
    ``world_size >= 1`` and ``1 <= group_size <= world_size``, any integers.

    Raises:
        TypeError: either argument is not an integer (``bool`` is not accepted).
        ValueError: a size is out of range; the message names the parameter, its value
            and the accepted values.
    """
    world_size = _as_int("world_size", world_size)
    group_size = _as_int("group_size", group_size)
    if world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size}")
    if not 1 <= group_size <= world_size:
        raise ValueError(f"group_size must be an int from 1 to the world size {world_size}, got {group_size}")


def _log2(n: int) -> int:
    return n.bit_length() - 1


def _extract(x: int, mask: int) -> int:
    """The bits of ``x`` under ``mask``, packed into the low bits (in order)."""
    out, bit = 0, 1
    while mask:
        low = mask & -mask
        if x & low:
            out |= bit
        bit <<= 1
        mask ^= low
    return out


def _deposit(x: int, mask: int) -> int:
    """The low bits of ``x`` spread, in order, onto the set bits of ``mask``
    (the inverse of :func:`_extract`)."""
    out = 0
    while mask:
        low = mask & -mask
        if x & 1:
            out |= low
        x >>= 1
        mask ^= low
    return out


@dataclass(frozen=True)
class GroupPlan:
    """One rank's part in the group allreduce of one iteration (what the
    schedules of :mod:`~collectives.wait_avoiding.group_allreduce` run).

    A rank of the hypercube core runs one butterfly phase per mask,
    exchanging with ``rank ^ mask``; if it hosts a folded rank
    (``folded_from``) it first adds that rank's contribution to its own and
    finally sends it the group's result.  A folded rank (``folded_into``:
    P is not a power of two and this rank lies above the core) runs no
    phase: it sends its contribution to its host and receives the result.
    """

    #: The xor mask of each butterfly phase, in order (empty for a folded rank).
    masks: tuple[int, ...]
    #: How many ranks this rank's group holds (the divisor of ``op="avg"``).
    size: int
    #: The host this rank is folded into, or None.
    folded_into: int | None = None
    #: The folded rank this rank hosts, or None.
    folded_from: int | None = None
    #: The ranks of this rank's group, sorted (the library's group
    #: allreduce runs on their communicator).
    members: tuple[int, ...] = ()


@dataclass(frozen=True)
class ButterflyGrouping:
    """Dynamic butterfly grouping of WAGMA-SGD (Li et al., IEEE TPDS 2021, Algorithm 1),
    for any world size P and group size S.

    **P and S powers of two** (the paper's case).  At iteration ``t`` the P ranks
    split into P / S disjoint groups of S ranks.  The groups are built by log2 S
    butterfly phases: ``shift = (t * log2 S) mod log2 P``; each phase pairs rank
    ``p`` with ``p ^ (1 << shift)`` and then sets ``shift = (shift + 1) mod log2 P``.
    The groups are the connected components of these pairings, i.e. the ranks
    reachable from a rank by xor with any subset of the phase masks.  The group
    allreduce runs the same phases as a butterfly (recursive doubling).

    Reading of the paper: Algorithm 1 writes ``mask <<= shift`` (shifting the running
    mask). Read literally this gives wrong groups (P = 8, S = 4, t = 1 would give masks
    4, 4 and groups of two). We follow the paper's own worked example instead, which
    needs ``mask = 1 << shift`` in each phase: P = 8, S = 4 gives {0,1,2,3},{4,5,6,7}
    at t = 0 and {0,1,4,5},{2,3,6,7} at t = 1.

    **Any P and S** (the generalization; the case above is its special case and
    keeps exactly the paper's groups).  Let d = floor(log2 P), the *core* be the
    ranks below 2**d, and the ``extras`` the P - 2**d ranks above it (the fold of
    recursive halving-doubling).  The number of groups is n = the largest power of
    two with n * S <= P, and each group holds 2**k core ranks, k = d - log2 n (the
    :attr:`num_phases`).  The core ranks form the groups of the power-of-two case
    with 2**d ranks and groups of 2**k (the masks above, with log2 P = d and
    log2 S = k); then extra rank 2**d + j joins core group ``j mod n`` (groups
    numbered by their lowest rank), folded into that group's core member number
    ``j // n`` (members in increasing order), which adds its contribution before the
    butterfly and sends it the result after.  So:

    - *Sizes.* Each group has floor(P / n) or ceil(P / n) ranks (the extras are
      dealt round-robin), and since n <= P / S < 2n, every group of every
      iteration has between S and 2S ranks (2S only when P > n (2S - 1), e.g.
      P = 7, S = 2: groups of 3 and 4).  A group never has one rank unless S = 1
      (then P = 2**d gives the paper's singletons and the extras make pairs).
    - *Change.* The core groups move to the next k hypercube dimensions
      (cyclically) every iteration, so the groups change at every iteration
      whenever 0 < k < d, i.e. S > 1 and n > 1; with n = 1 (S > P / 2) the
      one group is every rank.
    - *Reach.* An update made on any rank at any iteration t0 has reached every
      rank after T = ceil(d / k) iterations (t0, ..., t0 + T - 1),
      :attr:`iterations_to_connect`.  Proof: after iteration t0 every member of
      the rank's group holds it, among them a core rank c.  A core rank holding it
      before iteration t passes it to its whole group at t, whose core part is the
      coset of c under the span of t's k masks; so after iterations t0..t0+m-1 it
      holds on the coset of c under the span of their masks, which are k
      cyclically consecutive dimensions per iteration.  T - 1 iterations span a
      subspace V and iteration t0 + T - 1 a subspace W with V + W every dimension
      (T k >= d), so every coset of W (every group's core part at t0 + T - 1)
      meets c + V: every group of that iteration, extras included, holds it
      after it.  For S a power of two, k >= log2 S and T <= ceil(log_S P) (the
      paper's bound); otherwise k >= floor(log2 S) and T <= ceil(log_S' P) with
      S' = 2**floor(log2 S) (the extras also carry updates between cosets, which
      the bound leaves out: it can only be reached sooner).

    S = 1 and S = P give the same groups at every iteration.  Construction only
    validates; it runs no collective.

    With ``dynamic=False`` every iteration uses iteration 0's groups (the same k
    dimensions, masks 1, 2, ..., 2**(k-1): for powers of two blocks of S
    consecutive ranks).  That is the paper's ablation 2 (section 5.2, experiment
    2: "group model averaging without using the dynamic grouping strategy (i.e.,
    the groups are fixed)"; ResNet-50's top-1 accuracy "drops to 72.2%"): for
    n > 1 an update never leaves its group between the global averages.

    Args:
        world_size: number of ranks P >= 1 (1: one group, no phases).
        group_size: the least number of ranks per group S, 1 <= S <= P (exactly
            S when P and S are powers of two).
        dynamic: Algorithm 1's groups, which change with t (default); False: iteration
            0's groups at every iteration.

    Example::

        >>> ButterflyGrouping(8, 4).groups(1)
        [[0, 1, 4, 5], [2, 3, 6, 7]]
        >>> ButterflyGrouping(6, 3).groups(1)
        [[0, 2, 4], [1, 3, 5]]
    """

    world_size: int
    group_size: int
    dynamic: bool = True
    _dims: int = field(init=False, repr=False, compare=False)
    _groups: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_group_size(self.world_size, self.group_size)
        if not isinstance(self.dynamic, bool):
            raise TypeError(f"dynamic must be True or False, got {self.dynamic!r}")
        # Normalise integer-like values (e.g. numpy integers) to plain ints.
        world_size, group_size = operator.index(self.world_size), operator.index(self.group_size)
        object.__setattr__(self, "world_size", world_size)
        object.__setattr__(self, "group_size", group_size)
        object.__setattr__(self, "_dims", _log2(world_size))
        object.__setattr__(self, "_groups", 1 << _log2(world_size // group_size))

    @property
    def core_size(self) -> int:
        """Ranks in the hypercube core, 2**floor(log2 P); the ranks above it are folded."""
        return 1 << self._dims

    @property
    def num_groups(self) -> int:
        """The number n of groups per iteration, the largest power of two with n * S <= P."""
        return self._groups

    @property
    def num_phases(self) -> int:
        """Butterfly phases per iteration (log2 S for powers of two), the
        exchanges inside a group allreduce between its core ranks."""
        return self._dims - _log2(self._groups)

    @property
    def size_range(self) -> tuple[int, int]:
        """The sizes of the smallest and the largest group, floor(P / n) and
        ceil(P / n), between S and 2S (both S for powers of two)."""
        return self.world_size // self._groups, -(-self.world_size // self._groups)

    @property
    def period(self) -> int:
        """After how many iterations the groups repeat, d / gcd(d, k) for
        dynamic groups (the masks' start moves by k of d dimensions per
        iteration), else 1."""
        if not self.dynamic or self.num_phases == 0:
            return 1
        return self._dims // math.gcd(self._dims, self.num_phases)

    @property
    def iterations_to_connect(self) -> int | None:
        """The iterations after which an update made at any iteration has reached every rank.

        ``ceil(d / k)`` (d = floor(log2 P), k = :attr:`num_phases`; the class
        docstring proves it): ``ceil(log2 P / log2 S)`` for powers of two, where
        fewer never do.  Degenerate cases: 0 for P = 1 (one rank is already
        connected), 1 for a single group (S > P / 2), and ``None`` for S = 1 < P
        (groups never mix; only the periodic global allreduce connects ranks)
        and for fixed groups (``dynamic=False``) with more than one group.
        """
        if self.world_size == 1:
            return 0
        if self._groups == 1:
            return 1
        if self.num_phases == 0 or not self.dynamic:
            return None
        return math.ceil(self._dims / self.num_phases)

    def masks(self, t: int) -> tuple[int, ...]:
        """The xor mask of each butterfly phase of iteration ``t`` among the core
        ranks (``num_phases`` of them; iteration 0's at every ``t`` when not
        :attr:`dynamic`)."""
        t = _as_int("t", t)
        if t < 0:
            raise ValueError(f"t must be a non-negative iteration number, got {t}")
        dims = self._dims
        if dims == 0:
            return ()
        shift = (t * self.num_phases) % dims if self.dynamic else 0
        masks = []
        for _ in range(self.num_phases):
            masks.append(1 << shift)
            shift = (shift + 1) % dims
        return tuple(masks)

    def _check_rank(self, rank: int) -> int:
        rank = _as_int("rank", rank)
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank must be in range(world_size) = range({self.world_size}), got {rank}")
        return rank

    def _members(self, span: int, index: int) -> list[int]:
        """Group number ``index`` of the iteration whose masks sum to ``span``, sorted."""
        core = self.core_size
        base = _deposit(index, (core - 1) & ~span)
        members = _span_members(base, span)
        members += [core + j for j in range(index, self.world_size - core, self._groups)]
        return members

    def plan(self, t: int, rank: int) -> GroupPlan:
        """What ``rank`` does in the group allreduce of iteration ``t``."""
        rank = self._check_rank(rank)
        masks = self.masks(t)
        span, core = sum(masks), self.core_size
        free = (core - 1) & ~span
        if rank >= core:  # folded into member j // n of core group j mod n
            index, position = divmod(rank - core, self._groups)[::-1]
            host = _deposit(index, free) | _deposit(position, span)
            members = tuple(self._members(span, index))
            return GroupPlan((), self._size_of(index), folded_into=host, members=members)
        index = _extract(rank, free)
        guest = index + _extract(rank, span) * self._groups
        folded_from = core + guest if guest < self.world_size - core else None
        return GroupPlan(
            masks, self._size_of(index), folded_from=folded_from, members=tuple(self._members(span, index))
        )

    def _size_of(self, index: int) -> int:
        extras = self.world_size - self.core_size
        return (1 << self.num_phases) + extras // self._groups + (index < extras % self._groups)

    def partners(self, t: int, rank: int) -> tuple[int, ...]:
        """The partner of ``rank`` in each butterfly phase of iteration ``t``
        (``rank ^ mask``); none for a folded rank, which runs no phase."""
        plan = self.plan(t, rank)
        return () if plan.folded_into is not None else tuple(rank ^ mask for mask in plan.masks)

    def group_of(self, t: int, rank: int) -> list[int]:
        """The sorted group that ``rank`` averages with at iteration ``t``."""
        rank = self._check_rank(rank)
        span, core = sum(self.masks(t)), self.core_size  # distinct single-bit masks: their sum is their union
        free = (core - 1) & ~span
        index = (rank - core) % self._groups if rank >= core else _extract(rank, free)
        return self._members(span, index)

    def groups(self, t: int) -> list[list[int]]:
        """All :attr:`num_groups` groups of iteration ``t``: sorted lists of ranks,
        sorted by first rank."""
        span = sum(self.masks(t))
        return [self._members(span, index) for index in range(self._groups)]


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
    """Groups of at least S ranks (out of P; exactly S for powers of two) that
    average together at iteration ``t``.

    See :class:`ButterflyGrouping` (WAGMA-SGD, Li et al., IEEE TPDS 2021, Algorithm 1).
    """
    return ButterflyGrouping(P, S).groups(t)


def butterfly_masks(P: int, S: int, t: int) -> tuple[int, ...]:
    """The xor mask of each butterfly phase of iteration ``t`` (log2 S of them for powers of two)."""
    return ButterflyGrouping(P, S).masks(t)


def butterfly_partners(P: int, S: int, t: int, rank: int) -> tuple[int, ...]:
    """The partner of ``rank`` in each butterfly phase of iteration ``t``."""
    return ButterflyGrouping(P, S).partners(t, rank)


def group_of(P: int, S: int, t: int, rank: int) -> list[int]:
    """The group containing ``rank`` at iteration ``t``."""
    return ButterflyGrouping(P, S).group_of(t, rank)
