"""Activation trees, forwarding and version tags, without MPI."""

import random

import pytest

from collectives.wait_avoiding.activation import ActivationState, version_from_tag, version_tag


def test_root_sends_along_every_dimension():
    state = ActivationState(5, 16)
    assert state.activate(3) == [(4, 3, 0), (7, 3, 1), (1, 3, 2), (13, 3, 3)]
    assert state.activate(3) == []  # a second activator: nothing new


def test_paper_figure_1():
    # P1 activates on 4 ranks: P0 and P3 directly, P2 through P0.
    p1, p0 = ActivationState(1, 4), ActivationState(0, 4)
    assert [peer for peer, _, _ in p1.activate(0)] == [0, 3]
    assert p0.receive(0, 0) == [(2, 0, 1)]


@pytest.mark.parametrize("world_size", [3, 5, 6, 7, 12, 24])
def test_any_world_one_activator_is_a_binomial_tree_over_relative_ranks(world_size):
    """P not a power of two: dimension j links p to (p + 2**j) mod P; from
    root r, relative rank q = (p - r) mod P is first reached from q less its
    highest bit, after popcount(q) hops; wrapped messages reach no one new."""
    states = [ActivationState(r, world_size) for r in range(world_size)]
    assert states[0].dims == (world_size - 1).bit_length()
    for root in (0, world_size - 1, world_size // 2):
        for s in states:
            s.target, s.low = -1, s.dims
        hops, level = {root: 0}, [(root, send) for send in states[root].activate(7)]
        depth = 1
        while level:  # delivered level by level: hops counts the fewest
            following = []
            for sender, (peer, version, dim) in level:
                assert version == 7 and peer == (sender + (1 << dim)) % world_size
                hops.setdefault(peer, depth)
                following += [(peer, send) for send in states[peer].receive(version, dim)]
            level, depth = following, depth + 1
        assert hops == {p: bin((p - root) % world_size).count("1") for p in range(world_size)}


def test_old_versions_are_dropped_and_skipped_dimensions_resent():
    state = ActivationState(0, 8)
    assert state.receive(4, 2) == []  # through the top dimension: a leaf
    assert state.receive(3, 2) == []  # older: dropped
    assert state.receive(2, 0) == [(2, 4, 1), (4, 4, 2)]  # skipped dims, newest version
    assert state.receive(4, 1) == []


def _flood(world_size, seed):
    """Random activators and delivery order; the final targets, and the
    lowest version any activator activated."""
    rng = random.Random(seed)
    states = [ActivationState(r, world_size) for r in range(world_size)]
    activators = rng.sample(range(world_size), rng.randint(1, min(world_size, 4)))
    roots = [(a, rng.choice([2, 3])) for a in activators]
    lowest = min(version for _, version in roots)
    in_flight = []
    while roots or in_flight:
        if roots and (not in_flight or rng.random() < 0.3):
            rank, version = roots.pop(rng.randrange(len(roots)))
            in_flight += states[rank].activate(version)
        else:
            peer, version, dim = in_flight.pop(rng.randrange(len(in_flight)))
            in_flight += states[peer].receive(version, dim)
    return [s.target for s in states], lowest


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 64])
def test_every_rank_is_reached_whatever_the_order(world_size):
    for seed in range(300):
        targets, lowest = _flood(world_size, seed)
        assert min(targets) >= lowest, (seed, targets)


@pytest.mark.parametrize("tag_space", [2**15, 2**29])
def test_version_tags_wrap_around(tag_space):
    for reference in (0, 5, tag_space - 3, 10 * tag_space + 7, 2**40):
        for delta in (-100, -1, 0, 1, 2, 100):
            version = reference + delta
            if version < 0:
                continue
            tag = version_tag(version, tag_space)
            assert 0 <= tag < tag_space
            assert version_from_tag(tag, reference, tag_space) == version
