"""Generate StragglAR schedules (StragglAR paper, Algorithm 1 and appendix C).

Internally the non-stragglers are 0..n-2 (the g-th holds chunk g after the
ReduceScatter) and the straggler is n - 1; :func:`generate` relabels the
ranks for any other straggler.  In round r < n - 1 non-straggler r and the
straggler exchange chunk r and both reduce it; every other transfer copies a
fully reduced chunk.  A chunk is *active* from the round after it is fully
reduced until every non-straggler holds it.
"""

import random

from .schedule import Schedule, Transfer
from .verify import verify

__all__ = ["generate", "lower_bound"]


def lower_bound(n: int) -> int:
    """n + ceil(log2 n) - 2: the last chunk is fully reduced in round n - 2,
    on two ranks, and the number of its holders can at most double per round."""
    return n + (n - 1).bit_length() - 2


def generate(n: int, straggler: int | None = None) -> Schedule:
    """A verified schedule for ``n`` ranks with ``straggler`` late.

    Power-of-two n: :func:`power_of_two_rounds`, exactly n + log2 n - 2
    rounds (the lower bound).  Other n >= 2: :func:`best_deadline_rounds`,
    a deadline-first greedy that is valid for any n but not optimal (README,
    "StragglAR", lists the round counts).

    Args:
        n: the number of ranks, an int >= 2.
        straggler: the late rank, in range(n) (default n - 1).

    Raises:
        ValueError: naming the parameter and the accepted values.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ValueError(f"n must be an int >= 2, got {n!r}")
    straggler = n - 1 if straggler is None else straggler
    if isinstance(straggler, bool) or not isinstance(straggler, int) \
            or not 0 <= straggler < n:
        raise ValueError(f"straggler must be a rank in range({n}), got {straggler!r}")
    rounds = power_of_two_rounds(n) if n & (n - 1) == 0 else best_deadline_rounds(n)
    return verify(Schedule(n, straggler, _relabel(rounds, n, straggler)))


def _relabel(rounds, n, straggler):
    """Map internal rank g (non-stragglers 0..n-2, straggler n-1) to real ranks."""
    real = [g if g < straggler else g + 1 for g in range(n - 1)] + [straggler]
    return [[Transfer(real[t.src], real[t.dst], t.chunk, t.reduce) for t in r]
            for r in rounds]


def _exchange(r, straggler):
    """Round r's pair of reductions between non-straggler r and the straggler."""
    return [Transfer(r, straggler, r, True), Transfer(straggler, r, r, True)]


def power_of_two_rounds(n: int) -> list:
    """Algorithm 1 for n = 2**L: n + L - 2 rounds, every active chunk
    doubling in every round.

    Phase 1 (rounds 1..L-1, Lemma 1): every holder of an active chunk sends
    it to a rank that holds none, so that before round L chunk j is on
    2**(L-1-j) ranks and every non-straggler holds exactly one active chunk.
    The holder of the newest chunk c_{r-1} sends it to rank r - 1 + L, the
    others take ranks 2L - 1.. from the top: ranks L..2L-2 thus get the
    chunk that is oldest in the round they meet the straggler.

    Phase 2 (rounds r >= L, Lemma 2): P = the holders of c_{r-L}, the chunk
    due this round, without rank r; Q = the holders of the other active
    chunks, oldest first, with the straggler (holding c_{n-2}) from round
    n - 1 on.  |P| = |Q| and P[i] and Q[i] swap their active chunks, so
    c_{r-L} completes and every other chunk doubles.  Reading of the
    critical-window rule: the ranks r + 1..r + L - 1 of P (those that meet
    the straggler next) are matched first, with the *oldest* other chunks
    of Q, so that the chunk they get is the one due when their turn comes
    and the invariant r in P_r holds (the paper: "matching l with ranks
    possessing the second-oldest active chunk always works").
    """
    L = n.bit_length() - 1
    m, straggler = n - 1, n - 1
    holders = {}
    free = list(range(2 * L - 1, m))
    rounds = []
    for r in range(n + L - 2):
        transfers = _exchange(r, straggler) if r < m else []
        if 0 < r < L:
            _phase_one(r, L, holders, free, transfers)
        elif r >= L:
            _phase_two(r, L, m, holders, transfers)
        if r < m:
            holders[r] = [r]
        rounds.append(transfers)
    return rounds


def _phase_one(r, L, holders, free, transfers):
    grown = {}
    for chunk in sorted(holders):
        for h in holders[chunk]:
            dst = r - 1 + L if chunk == r - 1 else free.pop()
            transfers.append(Transfer(h, dst, chunk, False))
            grown.setdefault(chunk, []).append(dst)
    for chunk, ranks in grown.items():
        holders[chunk] += ranks


def _phase_two(r, L, m, holders, transfers):
    due = r - L
    window = range(r + 1, min(r + L, m))
    P = [g for g in holders[due] if g != r]
    P = sorted(g for g in P if g in window) + [g for g in P if g not in window]
    Q = [(chunk, g) for chunk in sorted(holders) if chunk != due for g in holders[chunk]]
    if r >= m:
        Q.append((m - 1, m))
    assert len(P) == len(Q), f"Algorithm 1 invariant broken in round {r}"
    grown = {}
    for p, (chunk, q) in zip(P, Q):
        if q != m:
            transfers.append(Transfer(p, q, due, False))
        transfers.append(Transfer(q, p, chunk, False))
        grown.setdefault(chunk, []).append(p)
    del holders[due]
    for chunk, ranks in grown.items():
        holders[chunk] += ranks


def deadline_rounds(n: int, seed: int | None = None) -> list:
    """A deadline-first greedy for any n >= 2 (used where n is not a power of two).

    With L = ceil(log2 n), chunk c is due after round c + L (the last one,
    which the straggler helps spread, after round n - 3 + L): the deadlines
    of Algorithm 1.  Each round, active chunks are served oldest first:
    every holder that is still free to send passes the chunk to a
    non-straggler that lacks it and is still free to receive.  Receivers are
    chosen by the critical-window rule of Algorithm 1, read as: a rank that
    meets the straggler within the next L - 1 rounds cannot forward what it
    gets then, so it is offered a chunk only when the chunk is due in the
    next round, and otherwise last; among the rest, ranks holding the fewest
    active chunks first (their send slot is the least contended).  Senders
    are likewise taken fewest-active-chunks first.  Remaining ties go by
    rank, or, with ``seed``, by a random order drawn from it (see
    :func:`best_deadline_rounds`).

    The paper's appendix C instead matches ranks by maximum-weight matching
    (weight 2 for a mutual need, 1 for a one-way need) and swaps chunks;
    our transcription of it needed more rounds than this greedy for every
    even n we tried (17 vs 15 at n = 12, 254 vs 147 at n = 130) and took
    28 s at n = 130, so it is not used.  Neither reaches the lower bound in
    general: README, "StragglAR", lists the counts for every even n <= 256.
    """
    m, straggler = n - 1, n - 1
    L = (n - 1).bit_length()
    full = (1 << m) - 1
    have = [0] * n
    copies = [0] * m
    rounds = []
    r = 0
    rng = None if seed is None else random.Random(seed)
    while r < m or any(h != full for h in have[:m]):
        tie = list(range(n)) if rng is None else [rng.random() for _ in range(n)]
        transfers = _exchange(r, straggler) if r < m else []
        sending, receiving = ({r, straggler}, {r, straggler}) if r < m else (set(), set())
        active = [c for c in range(min(r, m)) if copies[c] < m]
        active_mask = sum(1 << c for c in active)
        load = [(h & active_mask).bit_count() for h in have]
        window = range(r + 1, min(r + L, m))
        for c in active:
            bit = 1 << c
            holders = sorted((u for u in range(n) if have[u] & bit and u not in sending),
                             key=lambda u: (load[u], tie[u]))
            due_next = c + L - (c == m - 1) <= r + 1
            lacking = sorted((v for v in range(m) if not have[v] & bit and v not in receiving),
                             key=lambda v: (not due_next and v in window, load[v], tie[v]))
            for u, v in zip(holders, lacking):
                transfers.append(Transfer(u, v, c, False))
                sending.add(u)
                receiving.add(v)
        for t in transfers:
            if not have[t.dst] >> t.chunk & 1 and t.dst != straggler:
                copies[t.chunk] += 1
            have[t.dst] |= 1 << t.chunk
        if r < m:
            if not have[r] >> r & 1:
                copies[r] += 1
            have[r] |= 1 << r
        rounds.append(transfers)
        r += 1
    return rounds


#: Up to this n, :func:`best_deadline_rounds` tries seeded tie-breaks.
RESTART_MAX_N = 64
RESTARTS = 64


def best_deadline_rounds(n: int) -> list:
    """The shortest of :func:`deadline_rounds` with ties by rank and, for
    n <= :data:`RESTART_MAX_N`, with ties drawn from seeds 0..RESTARTS-1
    (stopping at the lower bound).  Deterministic.  Measured: the restarts
    reach the lower bound at n = 10 (12 rounds) and save one round at 14,
    22 and 30 (17, 26, 36)."""
    best = deadline_rounds(n)
    if n <= RESTART_MAX_N:
        for seed in range(RESTARTS):
            if len(best) == lower_bound(n):
                break
            candidate = deadline_rounds(n, seed)
            if len(candidate) < len(best):
                best = candidate
    return best
