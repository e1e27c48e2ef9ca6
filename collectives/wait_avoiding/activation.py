"""Activation of wait-avoiding collectives: binomial trees, forwarding rule, version tags.

Pure logic, no MPI: the progress thread feeds it the messages it receives and
sends the messages it returns.
"""

import numpy as np

__all__ = ["ActivationState", "RandomActivators", "version_from_tag", "version_tag"]


def version_tag(version: int, tag_space: int) -> int:
    """The MPI tag that carries ``version``: ``version mod tag_space``.

    ``tag_space`` is ``MPI.TAG_UB + 1`` (at least 32768 by the standard,
    2**29 with MPICH).  The wrap-around is harmless because every rank's
    versions stay within far less than ``tag_space / 2`` of every other
    rank's: a rank cannot finish version v before its group partners have
    executed it, and groups connect all ranks within
    :attr:`~collectives.wait_avoiding.groups.ButterflyGrouping.iterations_to_connect`
    versions (ceil(log2 P / log2 S) for powers of two).
    :func:`version_from_tag` undoes it.
    """
    return version % tag_space


def version_from_tag(tag: int, reference: int, tag_space: int) -> int:
    """The version congruent to ``tag`` modulo ``tag_space`` nearest ``reference``."""
    offset = (tag - reference) % tag_space
    if offset >= tag_space // 2:
        offset -= tag_space
    return reference + offset


class ActivationState:
    """What one rank has activated and forwarded (WAGMA section 3.1.1).

    Ranks are linked along d dimensions: for P a power of two the hypercube
    (d = log2 P, rank p's neighbour along dimension j is ``p ^ 2**j``, the
    paper's Figure 1), for any other P the ring's powers of two (d =
    ceil(log2 P), the neighbour is ``(p + 2**j) mod P``).  The activator of a
    version sends it along every dimension (the root of its binomial tree); a
    rank reached through dimension i forwards along the dimensions above i.
    From a root r this is a binomial tree: over the relative ranks ``p ^ r``,
    or ``(p - r) mod P``, q is reached from q minus its highest bit, through
    that bit's dimension, so every rank once.  For P not a power of two a
    rank forwards along every dimension above i, also where ``q + 2**j``
    passes P and wraps onto a rank the tree reaches otherwise: the rule
    then depends on the dimension alone, not on the root, which the
    argument below needs.
    A version carries "activate every version up to this one".

    Several activators: a rank that already has a version >= v does not send v
    again.  Dropping alone has no short proof that every rank is still reached
    when trees cross (a rank first reached through a high dimension forwards
    on few dimensions; in randomised interleavings it did reach every rank),
    so a rank also remembers ``low``, the lowest dimension above which it has
    sent its current ``target``, and when a message arrives through a lower
    dimension it sends ``target`` on the dimensions it skipped.  Invariant: a
    rank that received a version >= v through dimension i has sent a version
    >= v on every dimension above i; hence, by induction along the
    activator's tree, every rank receives a version >= v from any activator
    of v.  Each rank sends at most d messages per version it learns of, plus
    at most d re-sends.
    """

    def __init__(self, rank: int, world_size: int, target: int = -1) -> None:
        self.rank, self.world_size = rank, world_size
        self.hypercube = world_size & (world_size - 1) == 0
        self.dims = (world_size - 1).bit_length()  # log2 P for a power of two, else ceil(log2 P)
        self.target = target  # highest version activated on this rank
        self.low = self.dims  # ``target`` was sent on every dimension > low

    def activate(self, version: int) -> list[tuple[int, int, int]]:
        """This rank activates ``version`` itself (root of its tree)."""
        return self.receive(version, -1)

    def receive(self, version: int, dim: int) -> list[tuple[int, int, int]]:
        """An activation for ``version`` arrived through dimension ``dim``.

        Returns the messages to send, as ``(peer, version, dim)``.
        """
        if version > self.target:
            self.target, self.low = version, dim
            return self._along(dim + 1, self.dims)
        if dim < self.low:
            sends = self._along(dim + 1, self.low + 1)
            self.low = dim
            return sends
        return []

    def neighbour(self, dim: int) -> int:
        """The rank this one sends to along dimension ``dim``."""
        if self.hypercube:
            return self.rank ^ (1 << dim)
        return (self.rank + (1 << dim)) % self.world_size

    def _along(self, first: int, stop: int) -> list[tuple[int, int, int]]:
        return [(self.neighbour(j), self.target, j) for j in range(first, stop)]

    def __repr__(self) -> str:
        return f"ActivationState(rank={self.rank}, target={self.target}, low={self.low})"


class RandomActivators:
    """The rank that activates each version: pseudo-random, the same on every rank.

    eager-SGD's majority allreduce as its authors implemented it
    (``Shigangli/eager-SGD``, ``fflib2/src/colls/ffrand_allreduce.c``): every
    rank draws ``rand_r(&seed) % P`` at every call, from the same seed, so all
    agree on the activator of each version; only the activator's arrival
    starts it, and the others' calls only count it (they catch up on
    activations they did not make before activating their own).  A version
    thus waits for one random rank, which has in expectation half of the
    others arrived before it: the "majority" is statistical, not a quorum.

    Reading chosen for the stream: version v's activator is element
    ``v mod 1024`` of ``numpy.random.default_rng([seed, v // 1024])``'s
    ``integers(P, size=1024)``, not the v-th draw of one stream, so a run
    resumed at any version draws what the uninterrupted run drew.  Called
    by the main thread only (it decides at arrival whether it activates).
    """

    _BLOCK = 1024

    def __init__(self, seed: int, size: int) -> None:
        self.seed, self.size = seed, size
        self._block: int | None = None
        self._ranks: np.ndarray | None = None

    def __call__(self, version: int) -> int:
        block, index = divmod(version, self._BLOCK)
        if block != self._block or self._ranks is None:  # (None only before the first block)
            rng = np.random.default_rng([self.seed, block])
            self._block, self._ranks = block, rng.integers(self.size, size=self._BLOCK)
        return int(self._ranks[index])
