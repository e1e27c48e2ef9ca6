"""Serial tests of the WAGMA butterfly groups (collectives.wait_avoiding.groups)."""

import itertools
import math

import networkx as nx
import numpy as np
import pytest

from collectives.wait_avoiding.groups import (
    ButterflyGrouping,
    GroupPlan,
    butterfly_groups,
    butterfly_masks,
    butterfly_partners,
    check_group_size,
    group_of,
    is_power_of_two,
)
from wagma.options import auto_group_size

SIZES = [(P, S) for P in (2**n for n in range(11)) for S in (2**k for k in range(P.bit_length()))]
TS = list(range(21)) + [10**9 + 7]
SMALL_SIZES = [(P, S) for P, S in SIZES if P <= 64]


def _graph(P, S, ts):
    """Graph on range(P) with an edge for every butterfly pairing of the iterations ``ts``."""
    g = nx.Graph()
    g.add_nodes_from(range(P))
    for t in ts:
        for p in range(P):
            g.add_edges_from((p, q) for q in butterfly_partners(P, S, t, p))
    return g


def _as_groups(components):
    return sorted(sorted(c) for c in components)


# --- the paper's worked example (WAGMA-SGD section 3.2) -------------------------------


def test_paper_worked_example():
    assert butterfly_groups(8, 4, 0) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert butterfly_groups(8, 4, 1) == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert butterfly_masks(8, 4, 0) == (1, 2)
    assert butterfly_masks(8, 4, 1) == (4, 1)


def test_literal_mask_shift_reading_contradicts_example():
    """Algorithm 1's ``mask <<= shift``, read literally, breaks the worked example at t = 1."""
    P, S, t = 8, 4, 1
    mask, shift, literal = 1, (t * 2) % 3, []
    for _ in range(2):
        mask <<= shift
        literal.append(mask)
        shift = (shift + 1) % 3
    assert literal == [4, 4]  # one dimension twice: groups of 2, not 4
    assert butterfly_masks(P, S, t) != tuple(literal)


def test_world_size_one():
    g = ButterflyGrouping(1, 1)
    assert g.num_phases == 0
    assert g.iterations_to_connect == 0
    for t in (0, 1, 10**9 + 7):
        assert g.groups(t) == [[0]]
        assert g.masks(t) == ()
        assert g.partners(t, 0) == ()
        assert g.group_of(t, 0) == [0]


def test_repr_and_frozen():
    g = ButterflyGrouping(16, 4)
    assert repr(g) == "ButterflyGrouping(world_size=16, group_size=4, dynamic=True)"
    with pytest.raises(AttributeError):
        g.group_size = 8


# --- properties over P in {1, ..., 1024}, S in {1, ..., P} ----------------------------


@pytest.mark.parametrize("P,S", SIZES)
def test_groups_partition_ranks(P, S):
    for t in TS:
        groups = butterfly_groups(P, S, t)
        assert len(groups) == P // S
        assert all(len(g) == S and g == sorted(g) for g in groups)
        assert [g[0] for g in groups] == sorted(g[0] for g in groups)
        assert sorted(itertools.chain.from_iterable(groups)) == list(range(P))  # disjoint cover


@pytest.mark.parametrize("P,S", SIZES)
def test_masks_and_partners(P, S):
    grouping = ButterflyGrouping(P, S)
    for t in TS:
        masks = butterfly_masks(P, S, t)
        assert len(masks) == grouping.num_phases == int(math.log2(S))
        assert len(set(masks)) == len(masks) and all(is_power_of_two(m) and m < P for m in masks)
        group_index = {r: i for i, g in enumerate(grouping.groups(t)) for r in g}
        for rank in range(0, P, max(1, P // 32)):  # a spread of ranks, all of them for P <= 32
            partners = grouping.partners(t, rank)
            assert partners == tuple(rank ^ m for m in masks)
            for phase, q in enumerate(partners):
                assert q != rank
                assert grouping.partners(t, q)[phase] == rank  # involution
                assert group_index[q] == group_index[rank]
    assert butterfly_partners(P, S, 3, P - 1) == ButterflyGrouping(P, S).partners(3, P - 1)


@pytest.mark.parametrize("P,S", SIZES)
def test_group_of_agrees_with_groups(P, S):
    for t in (0, 1, 2, 7, 10**9 + 7):
        groups = butterfly_groups(P, S, t)
        for rank in range(0, P, max(1, P // 64)):
            g = group_of(P, S, t, rank)
            assert rank in g and g in groups


@pytest.mark.parametrize("P,S", SMALL_SIZES)
def test_groups_are_components_of_phase_pairings(P, S):
    """Algorithm 1 by its definition: connected components of the per-phase pairings."""
    for t in TS:
        assert butterfly_groups(P, S, t) == _as_groups(nx.connected_components(_graph(P, S, [t])))


@pytest.mark.parametrize("P,S", SIZES)
def test_groups_change_between_iterations_iff_1_lt_S_lt_P(P, S):
    # Iteration t uses the log2 S cyclically consecutive dimensions starting at
    # t * log2 S mod log2 P; the next start differs by log2 S, which is 0 mod log2 P
    # exactly when S == 1 or S == P (and P == 1 has no dimensions at all).
    must_change = 1 < S < P
    log_p, log_s = P.bit_length() - 1, S.bit_length() - 1
    assert must_change == (log_p > 0 and log_s % log_p != 0)
    for t in TS:
        changed = butterfly_groups(P, S, t) != butterfly_groups(P, S, t + 1)
        assert changed == must_change


@pytest.mark.parametrize("P,S", SMALL_SIZES)
def test_iterations_to_connect_is_tight(P, S):
    T = ButterflyGrouping(P, S).iterations_to_connect
    log_p, log_s = P.bit_length() - 1, S.bit_length() - 1
    if P == 1:
        assert T == 0
        return
    if S == 1:
        assert T is None  # singleton groups never mix
        assert nx.number_connected_components(_graph(P, S, range(log_p + 3))) == P
        return
    assert T == math.ceil(log_p / log_s)
    for start in (0, 1, 2, 5, 10**9 + 7):
        window = range(start, start + T)
        assert nx.is_connected(_graph(P, S, window))
        if T > 1:
            shorter = _graph(P, S, range(start, start + T - 1))
            # T - 1 iterations cover (T - 1) log2 S < log2 P dimensions.
            assert nx.number_connected_components(shorter) == P >> ((T - 1) * log_s)


def test_iterations_to_connect_values():
    assert ButterflyGrouping(8, 8).iterations_to_connect == 1
    assert ButterflyGrouping(8, 4).iterations_to_connect == 2
    assert ButterflyGrouping(8, 2).iterations_to_connect == 3
    assert ButterflyGrouping(1024, 32).iterations_to_connect == 2
    assert ButterflyGrouping(1024, 8).iterations_to_connect == 4


# --- fixed groups (WAGMA section 5.2, ablation 2) -------------------------------------


@pytest.mark.parametrize("P,S", SIZES)
def test_fixed_groups_are_iteration_0s_at_every_iteration(P, S):
    """Every iteration uses iteration 0's masks: blocks of S consecutive ranks."""
    fixed, dynamic = ButterflyGrouping(P, S, dynamic=False), ButterflyGrouping(P, S)
    blocks = [list(range(first, first + S)) for first in range(0, P, S)]
    assert dynamic.groups(0) == blocks
    for t in TS:
        assert fixed.masks(t) == dynamic.masks(0)
        assert fixed.groups(t) == blocks
        assert fixed.group_of(t, P - 1) == blocks[-1]
        assert fixed.partners(t, 0) == dynamic.partners(0, 0)


@pytest.mark.parametrize("P,S", SMALL_SIZES)
def test_fixed_groups_never_connect_unless_one_group(P, S):
    fixed = ButterflyGrouping(P, S, dynamic=False)
    if P == 1:
        assert fixed.iterations_to_connect == 0
    elif S == P:
        assert fixed.iterations_to_connect == 1
    else:
        assert fixed.iterations_to_connect is None
        g = nx.Graph()
        g.add_nodes_from(range(P))
        for t in range(P.bit_length() + 3):
            for p in range(P):
                g.add_edges_from((p, q) for q in fixed.partners(t, p))
        assert nx.number_connected_components(g) == P // S


def test_fixed_grouping_repr_and_bad_flag():
    assert (
        repr(ButterflyGrouping(8, 4, dynamic=False)) == "ButterflyGrouping(world_size=8, group_size=4, dynamic=False)"
    )
    for bad in (0, 1, "no", None):
        with pytest.raises(TypeError, match=f"dynamic must be True or False, got {bad!r}"):
            ButterflyGrouping(8, 4, dynamic=bad)


# --- helpers and bad input ------------------------------------------------------------


@pytest.mark.parametrize(
    "n,expected", [(1, True), (2, True), (1024, True), (0, False), (-2, False), (6, False), (True, False), (4.0, False)]
)
def test_is_power_of_two(n, expected):
    assert is_power_of_two(n) is expected


@pytest.mark.parametrize(
    "P,S,match",
    [
        (16, 17, r"group_size must be an int from 1 to the world size 16, got 17"),
        (6, 7, r"group_size .* world size 6, got 7"),
        (8, 0, r"group_size .* got 0"),
        (8, -4, r"group_size .* got -4"),
        (0, 1, r"world_size must be an int >= 1, got 0"),
        (-8, 1, r"world_size .* got -8"),
    ],
)
def test_bad_sizes(P, S, match):
    with pytest.raises(ValueError, match=match):
        check_group_size(P, S)
    with pytest.raises(ValueError, match=match):
        ButterflyGrouping(P, S)
    with pytest.raises(ValueError, match=match):
        butterfly_groups(P, S, 0)


@pytest.mark.parametrize(
    "P,S,name",
    [
        (8.0, 2, "world_size"),
        ("8", 2, "world_size"),
        (True, 1, "world_size"),
        (8, 2.0, "group_size"),
        (8, True, "group_size"),
        (8, None, "group_size"),
    ],
)
def test_non_int_sizes(P, S, name):
    with pytest.raises(TypeError, match=name):
        ButterflyGrouping(P, S)


def test_bad_iteration_and_rank():
    with pytest.raises(ValueError, match=r"t must be .* got -1"):
        butterfly_groups(8, 4, -1)
    with pytest.raises(TypeError, match="t must be an int"):
        butterfly_masks(8, 4, 1.5)
    with pytest.raises(TypeError, match="t must be an int"):
        butterfly_masks(8, 4, True)
    with pytest.raises(ValueError, match=r"rank must be in range\(world_size\) = range\(8\), got 8"):
        group_of(8, 4, 0, 8)
    with pytest.raises(ValueError, match="rank .* got -1"):
        butterfly_partners(8, 4, 0, -1)
    with pytest.raises(TypeError, match="rank must be an int"):
        butterfly_partners(8, 4, 0, "0")


def test_integer_like_sizes_are_normalised():
    np = pytest.importorskip("numpy")
    g = ButterflyGrouping(np.int64(8), np.int32(4))
    assert type(g.world_size) is int and type(g.group_size) is int
    assert g.groups(np.int64(1)) == [[0, 1, 4, 5], [2, 3, 6, 7]]


# --- any P and S (the fold of the ranks above the hypercube core) ----------------------

ANY_P = range(2, 65)
ANY_S = (2, 3, 4, 8, "auto")


def _any_sizes():
    """(P, S) for every P in 2..64 and S in ANY_S that fits (S <= P)."""
    for P in ANY_P:
        for S in ANY_S:
            S = auto_group_size(P) if S == "auto" else S
            if S <= P:
                yield P, S


def _same_group(grouping, t):
    """``[P, P]`` bool: whether two ranks share a group at iteration ``t``."""
    label = np.empty(grouping.world_size, dtype=np.int64)
    for i, g in enumerate(grouping.groups(t)):
        label[g] = i
    return label[:, None] == label[None, :]


def _spread(grouping, start, limit):
    """Iterations until an update made by each rank at iteration ``start``
    has reached every rank (simulated through the groups of consecutive
    iterations, all ranks at once); None beyond ``limit``."""
    P = grouping.world_size
    holds = np.eye(P, dtype=bool)  # holds[r, q]: rank q has r's update
    for k in range(1, limit + 1):
        holds = (holds.astype(np.int64) @ _same_group(grouping, start + k - 1).astype(np.int64)) > 0
        if holds.all():
            return k
    return None


def test_paper_groups_are_kept_and_a_fold_example():
    """Powers of two are the paper's groups (above); P = 6, S = 3 folds ranks 4
    and 5 into the two groups of two core ranks, which change with t."""
    g = ButterflyGrouping(6, 3)
    assert (g.core_size, g.num_groups, g.num_phases) == (4, 2, 1)
    assert g.groups(0) == [[0, 1, 4], [2, 3, 5]]
    assert g.groups(1) == [[0, 2, 4], [1, 3, 5]]
    assert g.plan(1, 4) == GroupPlan((), 3, folded_into=0, members=(0, 2, 4))
    assert g.plan(1, 0) == GroupPlan((2,), 3, folded_from=4, members=(0, 2, 4))
    assert g.plan(1, 2) == GroupPlan((2,), 3, members=(0, 2, 4))
    assert g.partners(1, 5) == ()
    assert ButterflyGrouping(7, 2).groups(0) == [[0, 1, 4, 6], [2, 3, 5]]  # 2S = 4 at most


ANY_SIZES = list(_any_sizes())


def test_any_world_groups_partition_with_sizes_between_S_and_2S():
    for P, S in ANY_SIZES:
        _check_partition(P, S)


def _check_partition(P, S):
    grouping = ButterflyGrouping(P, S)
    n, (low, high) = grouping.num_groups, grouping.size_range
    assert n & (n - 1) == 0 and n * S <= P < 2 * n * S  # the most groups of S or more
    assert S <= low <= high <= 2 * S and (low, high) == (P // n, -(-P // n))
    assert low >= 2  # never a rank alone
    for t in range(grouping.period + 1):
        groups = grouping.groups(t)
        assert len(groups) == n
        assert sorted(itertools.chain.from_iterable(groups)) == list(range(P))  # disjoint cover
        assert all(g == sorted(g) and low <= len(g) <= high for g in groups)
        assert [g[0] for g in groups] == sorted(g[0] for g in groups)
        if n > 1:
            assert groups != grouping.groups(t + 1)  # membership changes every iteration
        for rank in range(P):
            assert rank in grouping.group_of(t, rank) in groups


def test_any_world_plans_run_the_group():
    """Every rank's plan: a folded rank's host is a core rank of its group
    hosting it alone; a core rank's phases pair it with core ranks of its
    group (an involution), and the phases connect the group's core."""
    for P, S in ANY_SIZES:
        _check_plans(P, S)


def _check_plans(P, S):
    grouping = ButterflyGrouping(P, S)
    core = grouping.core_size
    for t in range(grouping.period):
        for group in grouping.groups(t):
            plans = {r: grouping.plan(t, r) for r in group}
            assert all(p.size == len(group) and p.members == tuple(group) for p in plans.values())
            members = [r for r in group if r < core]
            assert len(members) == 1 << grouping.num_phases
            for r in group:
                p = plans[r]
                if r >= core:
                    assert p.masks == () and p.folded_from is None and p.folded_into in members
                    assert plans[p.folded_into].folded_from == r
                    continue
                assert p.folded_into is None and p.masks == grouping.masks(t)
                assert (p.folded_from is None) or plans[p.folded_from].folded_into == r
                for phase, mask in enumerate(p.masks):
                    assert r ^ mask in members and plans[r ^ mask].masks[phase] == mask
            reached = {members[0]}
            for mask in grouping.masks(t):
                reached |= {r ^ mask for r in reached}
            assert reached == set(members)


def test_any_world_updates_reach_every_rank_within_the_bound():
    """From every rank and every starting iteration of a period, an update
    reaches every rank within ``iterations_to_connect`` = ceil(d / k)
    iterations (the docstring's proof), which is at most ceil(log_S P)
    for S a power of two and ceil(log_S' P), S' = 2**floor(log2 S), else."""
    for P, S in ANY_SIZES:
        _check_reach(P, S)


def _check_reach(P, S):
    grouping = ButterflyGrouping(P, S)
    T = grouping.iterations_to_connect
    d, k = P.bit_length() - 1, grouping.num_phases
    assert T == (1 if grouping.num_groups == 1 else math.ceil(d / k))
    rounded = 1 << (S.bit_length() - 1)
    assert T <= math.ceil(math.log(P) / math.log(rounded) - 1e-9)
    for start in range(grouping.period):
        assert _spread(grouping, start, T) is not None, (start, T)


@pytest.mark.parametrize("P", [3, 5, 6, 7, 12, 24])
def test_any_world_fixed_groups_are_iteration_0s(P):
    for S in (2, 3):
        fixed, dynamic = ButterflyGrouping(P, S, dynamic=False), ButterflyGrouping(P, S)
        for t in (0, 1, 2, 7):
            assert fixed.groups(t) == dynamic.groups(0)
            assert fixed.plan(t, P - 1) == dynamic.plan(0, P - 1)
        if fixed.num_groups > 1:
            assert fixed.iterations_to_connect is None
            assert _spread(fixed, 0, P) is None


def test_group_size_one_and_the_whole_world():
    """S = 1: the paper's singletons on 2**d ranks, pairs where ranks are
    folded, never mixing; S > P / 2: one group of every rank."""
    g = ButterflyGrouping(6, 1)
    assert g.groups(3) == [[0, 4], [1, 5], [2], [3]] == g.groups(0)
    assert g.iterations_to_connect is None and g.size_range == (1, 2)
    for P in (3, 5, 6, 7):
        for S in range(P // 2 + 1, P + 1):
            whole = ButterflyGrouping(P, S)
            assert whole.groups(5) == [list(range(P))] and whole.iterations_to_connect == 1
