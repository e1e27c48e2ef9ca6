"""Generate StragglAR schedules: Algorithm 1 for powers of two, periodic templates otherwise.

The problem (Devraj et al., "StragglAR", section 3; the model checked by
:func:`~collectives.stragglar.verify.verify`): n ranks, straggler S and
m = n - 1 non-stragglers, a buffer of m chunks.  Before round 0 the g-th
non-straggler holds chunk g reduced over the non-stragglers.  In round
r < m that rank and S exchange chunk r and both reduce it; every other
transfer copies a fully reduced chunk to a rank that lacks it; each rank
sends at most one and receives at most one message per round.

Lower bound (any n): chunk m - 1 is fully reduced in round m - 1 on two
ranks and at most doubles per round, so n + ceil(log2 n) - 2 rounds.

* n a power of two: the paper's Algorithm 1, exactly n + log2 n - 2 rounds
  (Lemma 1, Lemma 2, Theorem 1).
* any other n (odd n included): a periodic template for rounds 0..m-1 and a
  flow-based plan for the last ceil(log2 n) - 1 rounds; it meets the lower
  bound for every n tried (verified for all n from 3 to 300 and spot checks
  up to 1100, see ``results/stragglar_schedules/stragglar_rounds.md``; round counts at the bound
  up to 2050).  The paper's appendix C instead runs a maximum-weight
  matching per round and needs up to ~log2 n more rounds.

All schedules are built for straggler n - 1 and relabelled; the output is
deterministic.
"""

import random
from collections import deque

from .schedule import Schedule, Transfer

__all__ = ["generate", "lower_bound", "plan", "relabelling"]

#: Attempts (seeds) of the endgame planner before it is given one more round.
_TRIES = 20


def generate(n: int, straggler: int | None = None) -> Schedule:
    """The StragglAR schedule for ``n`` ranks and ``straggler`` (default n - 1).

    Built for straggler n - 1 by :func:`plan`, then relabelled: the g-th
    non-straggler keeps chunk g (:meth:`~collectives.stragglar.schedule.Schedule.owner`).

    Raises:
        ValueError: ``n`` is not an int >= 2 or ``straggler`` is not a rank.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ValueError(f"n must be an int >= 2, got {n!r}")
    if straggler is None:
        straggler = n - 1
    if isinstance(straggler, bool) or not isinstance(straggler, int) or not 0 <= straggler < n:
        raise ValueError(f"straggler must be a rank in range({n}), got {straggler!r}")
    rounds, _ = plan(n)
    return Schedule(n, straggler, _relabel(rounds, n, straggler))


def lower_bound(n: int) -> int:
    """n + ceil(log2 n) - 2: no schedule for n >= 2 ranks has fewer rounds."""
    return n + (n - 1).bit_length() - 2


def plan(n: int) -> tuple[list, str]:
    """Rounds of ``(src, dst, chunk, reduce)`` for straggler n - 1, and the method's name."""
    if n & (n - 1) == 0:
        return _algorithm1(n), "Algorithm 1"
    m, span = n - 1, (n - 1).bit_length()
    template = _template(m, span) if span + 1 < m else None
    if template is None:  # n = 3, 5: too few ranks for a template
        lacking = [set(range(m)) - {g} for g in range(m)]
        return _finish(lacking, 0, lower_bound(n) - 1, m), "flow planner"
    steady, lacking = _steady_rounds(m, *template)
    rounds = _finish(lacking, m, lower_bound(n) - 1, m)
    return steady + rounds, "template + flow endgame"


def relabelling(n: int, straggler: int) -> list[int]:
    """The rank of each label of :func:`plan`'s schedule (built for
    straggler n - 1) once relabelled for ``straggler``: label g < n - 1, the
    g-th non-straggler, becomes the g-th rank other than ``straggler``, and
    label n - 1 becomes ``straggler``."""
    return [g if g < straggler else g + 1 for g in range(n - 1)] + [straggler]


def _relabel(rounds, n, straggler):
    """Map straggler n - 1 to ``straggler`` and the g-th non-straggler to its rank."""
    rank = relabelling(n, straggler)
    return [[Transfer(rank[u], rank[v], c, red) for u, v, c, red in r] for r in rounds]


# --- Powers of two: Algorithm 1 ---------------------------------------------


def _algorithm1(n):
    """Algorithm 1 of the paper, for n = 2**k, in n + k - 2 rounds.

    ``active`` maps each active chunk (fully reduced, not yet everywhere) to
    the non-stragglers holding it.  Phase 1 (rounds 1..k-1, Lemma 1): every
    holder copies its chunk to a rank without one; rank r-1 sends c_{r-1}
    to rank r-1+k, the others fill ranks > 2(k-1) in order, so that after
    round k-1 every non-straggler holds exactly one active chunk.  Phase 2
    (rounds r >= k, Lemma 2): P = holders of the oldest chunk c_{r-k}
    except rank r, Q = holders of the others (plus the straggler, holding
    c_{n-2}, from round n-1 on); matched P-Q pairs exchange their chunks.

    Reading of the critical-window rule: line 15 of the listing is garbled
    in our copy, and a literal transcription of it fails (17 rounds at
    n = 8, no termination from n = 32).  We follow the proof of Lemma 2
    instead: a P-rank g with r < g < r + k (it meets the straggler within k
    rounds) must not take a chunk newer than c_{g-k}, else it would not hold
    the oldest chunk when its turn comes; giving every such g the
    second-oldest chunk c_{r-k+1} satisfies this, and there are n/4 >= k - 1
    holders of it, so the window is matched first, with the oldest chunks.
    """
    k = n.bit_length() - 1
    m = s = n - 1
    active = {}
    free = list(range(2 * k - 1, m))
    rounds = []
    for r in range(n + k - 2):
        if r < k:
            copies = _phase1(r, k, active, free)
        else:
            copies = _phase2(r, k, m, s, active)
        for _, dst, c, _ in copies:
            active[c].append(dst)
        if r - k in active:
            del active[r - k]
        exchange = []
        if r < m:
            active[r] = [r]
            exchange = [(r, s, r, True), (s, r, r, True)]
        rounds.append(exchange + copies)
    return rounds


def _phase1(r, k, active, free):
    """Round r < k: every holder sends its chunk to a rank without one."""
    copies = []
    for c, holders in sorted(active.items()):
        for h in holders:
            dst = h + k if h == c == r - 1 else free.pop()
            copies.append((h, dst, c, False))
    return copies


def _phase2(r, k, m, s, active):
    """Round r >= k: P sends the oldest chunk to Q, Q sends its chunk back."""
    oldest = r - k
    window = range(r + 1, min(r + k, m))
    p = [g for g in active[oldest] if g != r]
    p.sort(key=lambda g: (g not in window, g))
    q = [(g, c) for c, holders in sorted(active.items()) if c != oldest for g in holders]
    if r >= m:
        q.append((s, m - 1))
    copies = []
    for pg, (qg, c) in zip(p, q, strict=True):
        if qg != s:
            copies.append((pg, qg, oldest, False))
        copies.append((qg, pg, c, False))
    return copies


# --- Other n: the periodic template -----------------------------------------
#
# Write A = ceil(log2 n) + 1.  Chunk c is copied at ages 1..A (rounds
# c+1..c+A), the same way for every c up to a shift of all ranks by c
# (mod m): "offset x" is rank c + x.  Offset x receives the chunk at age
# A - d[x] (d[0] = A: offset 0 reduces it at age 0) and may send it at the
# later ages.  In round t the rank g sits at "slot" y = g - t + A (mod m),
# one slot lower each round, and for the chunk of age a plays offset
# x = y - (A - a).  So:
#
# * rank at slot y receives the chunk whose x has x + d[x] = y: every rank
#   receives once per round iff x -> x + d[x] is a permutation, i.e. d is a
#   juggling siteswap; the rank at slot A (the straggler's partner) gets
#   the chunk it reduces;
# * rank at slot y holds, still spreading, the chunks with x <= y < x + d[x]
#   ("cells" (x, e = y - x)); their number is the siteswap's ball count,
#   here 2 (Algorithm 1 is the one-ball case, one active chunk per rank,
#   possible only for n = 2**k); it sends one selected cell, none at slot A;
# * per age the senders must equal the receivers in number.
#
# Ages 1..A-E double every chunk (every holder sends: "deep" cells e >= E
# are all selected, so no two may meet in a slot); the last E ages finish
# it.  Counting sends and receives shows the steady state is saturated
# and the first rounds lose exactly 2**ceil(log2 n) - n transfers, the
# whole slack of the lower bound; the endgame must then be exact too.


def _template(m, span):
    """Heights and selected cells of a template for m non-stragglers, or None.

    Searches depth E of the finishing ages, then t (threes thrown inside
    compositions), the profile (how many offsets finish at each of the last
    E ages), then b (standalone 2-throws); the first candidate whose siteswap
    is valid and whose cells can be selected wins.  Profiles are tried in a
    seeded random order: for E = 4 most of them work, but not the first
    few of the natural order, and there are thousands.
    """
    a_max = span + 1
    for e_depth in (2, 3, 4):
        profiles = list(_profiles(m, span, e_depth))
        random.Random(m).shuffle(profiles)
        for threes_inside in range(4):
            for counts in profiles:
                found = _try_profile(m, a_max, e_depth, counts, threes_inside)
                if found:
                    return found
    return None


def _profiles(m, span, e_depth):
    """Counts {height: offsets} with doubling ages 1..A-E and E finishing ages.

    Heights A-1..E (ages 1..A-E) have 1, 2, 4, ... offsets: every holder
    copies the chunk every round.  Heights below E are chosen so that all
    m - 1 offsets receive once, heights sum to 2m (two balls), and at each
    age the receivers do not outnumber the holders.
    """
    a_max = span + 1
    doubling = {a_max - a: 2 ** (a - 1) for a in range(1, a_max - e_depth + 1)}
    rest = m - 1 - sum(doubling.values())
    weight = 2 * m - a_max - sum(h * c for h, c in doubling.items())
    if rest < 0 or weight < 0:
        return

    def fill(e, holders, rest, weight, counts):
        if e == 0:
            if weight == 0 and rest <= holders:
                yield {**doubling, **counts, 0: rest}
            return
        for c in range(min(holders, rest, weight // e), -1, -1):
            yield from fill(e - 1, holders + c, rest - c, weight - e * c, {**counts, e: c})

    yield from fill(e_depth - 1, 1 + sum(doubling.values()), rest, weight, {})


def _try_profile(m, a_max, e_depth, counts, threes_inside):
    """Try the b values of one profile; return ``(d, cells, a_max)`` or None."""
    if threes_inside and (e_depth < 3 or counts.get(3, 0) < threes_inside):
        return None
    leaders = [a_max] + sorted((h for h, c in counts.items() if h >= 3 for _ in range(c)), reverse=True)
    del leaders[len(leaders) - threes_inside :]
    best = _max_gaps(leaders, e_depth)
    if best is None:
        return None
    total = sum(leaders)
    twos = counts.get(2, 0)
    for b in range(min(twos, sum(best) + m - total), max(0, len(leaders) + m - total) - 1, -1):
        d = _chain(m, leaders, best, total + b - m, threes_inside, twos - b, b, e_depth)
        if d is None or len({(x + h) % m for x, h in enumerate(d)}) != m:
            continue
        cells = _select_cells(d, a_max, e_depth)
        if cells is not None:
            return d, cells, a_max
    return None


def _max_gaps(leaders, e_depth):
    """Gaps j_i maximizing their sum, for the leader chain of :func:`_chain`.

    Leader i is thrown j_i beats before leader i-1's ball lands again;
    1 <= j_i <= min(E, h_i - 1), j_0 <= E - 1 (slot A is not deep) and
    j_{i-1} + j_i <= h_i (the composition in between is not negative).
    Dynamic programme around the cycle; None if no gaps fit.
    """
    caps = [min(e_depth, h - 1) for h in leaders]
    caps[0] = min(caps[0], e_depth - 1)
    best = None
    for first in range(1, caps[0] + 1):
        layer = {first: (first, [first])}
        for h, cap in zip(leaders[1:], caps[1:]):
            layer = {
                j: max((s + j, gaps + [j]) for prev, (s, gaps) in layer.items() if prev + j <= h)
                for j in range(1, cap + 1)
                if any(prev + j <= h for prev in layer)
            }
        for last, (s, gaps) in layer.items():
            if last + first <= leaders[0] and (best is None or s > sum(best)):
                best = gaps
    return best


def _chain(m, leaders, best, target, threes, twos, blocks, e_depth):
    """A two-ball siteswap of period m as a chain of leaders, or None.

    Leaders (every height >= 3 but ``threes`` of the 3s) alternate between
    the two balls: leader i is thrown at beat s_i, and the other ball,
    after landing, fills beats up to s_{i+1} = s_i + h_i - j_i with a
    "composition" of short throws (1, "2 0", "3 0 0"); gaps j_i <= E keep
    the deep parts of consecutive leaders apart.  The gaps ``best`` are
    lowered to sum to ``target``, growing the compositions where the
    short throws must go; ``blocks`` throws of 2 are inserted where both
    balls land on consecutive beats.
    """
    k = len(leaders)
    gaps = list(best)
    excess = sum(gaps) - target
    room = [leaders[(i + 1) % k] - gaps[i] - gaps[(i + 1) % k] for i in range(k)]
    fill = [[] for _ in range(k)]

    def lower(i):
        gaps[i] -= 1
        room[i - 1] += 1
        room[i] += 1

    for size, count in ((3, threes), (2, twos)):
        for _ in range(count):
            i = max(range(k), key=room.__getitem__)
            while room[i] < size:
                grow = [g for g in (i, (i + 1) % k) if gaps[g] > 1]
                if not grow or not excess:
                    return None
                lower(grow[0])
                excess -= 1
            fill[i] += [size] + [0] * (size - 1)
            room[i] -= size
    for i in sorted(range(k), key=lambda i: -leaders[i]) * e_depth:
        if excess and gaps[i] > 1:
            lower(i)
            excess -= 1
    ground = [i for i in range(k) if gaps[i] == 1]
    if excess or (blocks and not ground):
        return None
    d = []
    for i in range(k):
        d += [leaders[i]] + [0] * (gaps[i - 1] - 1) + fill[i - 1] + [1] * room[i - 1]
        if blocks and i == ground[0]:
            d += [2] * blocks
    return d if len(d) == m else None


def _select_cells(d, a_max, e_depth):
    """The cell each slot sends, ``{slot: (x, e)}``, or None.

    Every slot must carry exactly two cells, at most one of them deep
    (e >= E), and slot A none deep.  Deep cells are sent; of the others one
    per slot is picked (none at slot A) so that, for every e, as many cells
    (x, e) send as offsets receive at that age (d[x] = e, x != 0).
    """
    m = len(d)
    quota = dict.fromkeys(range(a_max), 0)
    for h in d[1:]:
        quota[h] += 1
    chosen, open_slots = {}, {}
    for y in range(m):
        cells = [e for e in range(a_max) if e < d[(y - e) % m]]
        deep = [e for e in cells if e >= e_depth]
        if len(cells) != 2 or len(deep) > 1 or (deep and y == a_max % m):
            return None
        if deep:
            chosen[y] = ((y - deep[0]) % m, deep[0])
            quota[deep[0]] -= 1
        elif y != a_max % m:
            open_slots.setdefault(tuple(cells), []).append(y)
    if any(quota[e] for e in range(e_depth, a_max)):
        return None
    first = _split_pairs({pair: len(ys) for pair, ys in open_slots.items()}, {e: quota[e] for e in range(e_depth)})
    if first is None:
        return None
    for pair, ys in open_slots.items():
        for i, y in enumerate(ys):
            e = pair[0] if i < first[pair] else pair[1]
            chosen[y] = ((y - e) % m, e)
    return chosen


def _split_pairs(pairs, quota):
    """How many slots of each pair ``(e1, e2)`` pick e1, so that every e is
    picked ``quota[e]`` times, or None: a maximum flow on a graph of at most
    ten nodes (pair types and classes e < E <= 4)."""
    if sum(pairs.values()) != sum(quota.values()):
        return None
    residual = {"source": dict(pairs), "sink": dict.fromkeys(quota, 0)}
    for e, count in quota.items():
        residual[e] = {"sink": count} | {pair: 0 for pair in pairs if e in pair}
    for pair, count in pairs.items():
        residual[pair] = {"source": 0, pair[0]: count, pair[1]: count}
    total = 0
    while (path := _augmenting_path(residual, "source", "sink")) is not None:
        push = min(residual[u][v] for u, v in path)
        for u, v in path:
            residual[u][v] -= push
            residual[v][u] += push
        total += push
    if total != sum(pairs.values()):
        return None
    return {pair: count - residual[pair][pair[0]] for pair, count in pairs.items()}


def _augmenting_path(residual, source, sink):
    """The edges of a shortest source-sink path with capacity left, or None."""
    prev = {source: None}
    queue = deque([source])
    while queue:
        u = queue.popleft()
        for v, capacity in residual[u].items():
            if capacity and v not in prev:
                prev[v] = u
                if v == sink:
                    path = []
                    while prev[v] is not None:
                        path.append((prev[v], v))
                        v = prev[v]
                    return path
                queue.append(v)
    return None


def _steady_rounds(m, d, cells, a_max):
    """Rounds 0..m-1 of the template, and what every rank then lacks.

    Returns the rounds and ``missing``: per non-straggler the chunks it
    still lacks after round m - 1 (offset x gets chunk c in round
    c + a_max - d[x], so only the last ``a_max`` chunks can be missing).
    """
    receivers = {a: [x for x in range(1, m) if d[x] == a_max - a] for a in range(1, a_max + 1)}
    senders = {a: [] for a in range(1, a_max + 1)}
    for y in sorted(cells):
        x, e = cells[y]
        senders[a_max - e].append(x)
    pairs = {a: list(zip(senders[a], receivers[a], strict=True)) for a in senders}
    rounds = []
    for t in range(m):
        rounds.append(
            [(t, m, t, True), (m, t, t, True)]
            + [
                ((c + xs) % m, (c + xr) % m, c, False)
                for a in range(1, min(t, a_max) + 1)
                for c in [t - a]
                for xs, xr in pairs[a]
            ]
        )
    missing = [set() for _ in range(m)]
    for c in range(max(0, m - a_max), m):
        for x in range(1, m):
            if c + a_max - d[x] > m - 1:
                missing[(c + x) % m].add(c)
    return rounds, missing


# --- The flow planner (endgame, tiny n) -------------------------------------


def _finish(lacking, start, last, m):
    """Rounds from ``start`` on that leave every chunk on every rank.

    Plans to finish by round ``last``; after ``_TRIES`` failed seeds it
    allows one more round, and so on (with enough rounds the planner always
    finishes: every round serves a rank that lacks something).
    """
    while True:
        for seed in range(_TRIES):
            rounds = _plan_rounds(lacking, start, last, m, random.Random(seed))
            if rounds is not None:
                return rounds
        last += 1


def _plan_rounds(lacking, start, last, m, rnd):
    """Rounds ``start``.. given the chunks each non-straggler lacks, or None.

    None if the chunks are not everywhere after round ``last``.  Rounds
    before m also carry the straggler's exchange.  ``holders`` keeps only
    the reduced chunks some rank still lacks (the straggler among the
    holders).
    """
    missing = [set(chunks) for chunks in lacking]
    holders = {c: {g for g in range(m) if c not in missing[g]} | {m} for c in set().union(*missing) if c < start}
    rounds = []
    for t in range(start, last + 1):
        copies = _round_copies(t, last, m, holders, missing, rnd)
        if copies is None:
            return None
        for _, dst, c in copies:
            holders[c].add(dst)
            missing[dst].discard(c)
            if len(holders[c]) == m + 1:
                del holders[c]
        exchange = []
        if t < m:
            holders[t] = {t, m}
            exchange = [(t, m, t, True), (m, t, t, True)]
        rounds.append(exchange + [(u, v, c, False) for u, v, c in copies])
        if t >= m - 1 and not any(missing):
            return rounds
    return None


def _round_copies(t, last, m, holders, missing, rnd):
    """The copies ``(src, dst, chunk)`` of round t, or None if ``last`` is out of reach.

    A chunk lacked by M ranks and held by h reaches at most h * 2**left
    ranks in the ``left`` rounds up to ``last``, so at least
    ceil((M - h (2**(left-1) - 1)) / 2**(left-1)) ranks must get it now.
    Those minimums are placed first (scarcest chunks first, senders with
    the fewest chunks first); then every other rank is served along
    augmenting paths that never take a chunk below its minimum.  A rank
    lacking as many chunks as it has rounds left must be served.
    """
    left = last - t + 1
    busy = t if t < m else None
    send = {c: [g for g in h if g != busy and (g < m or t >= m)] for c, h in holders.items()}
    need = {c: max(0, -(-(m + 1 - 2 ** (left - 1) * len(h)) // 2 ** (left - 1))) for c, h in holders.items()}
    options = {g: [c for c in holders if c in missing[g]] for g in range(m) if g != busy}
    for lists in (options, send):
        for values in lists.values():
            rnd.shuffle(values)
    match = _Match(need, send)
    _place_minimums(match, options, rnd)
    if any(match.flow[c] < need[c] for c in holders):
        return None
    order = [g for g in options if g not in match.chunk]
    rnd.shuffle(order)
    for g in order:
        match.augment(g, options)
    for g in options:
        rounds_left = left - (1 if t < g < m else 0)
        if g not in match.chunk and len(missing[g]) >= rounds_left:
            return None
    return [(match.sender[v], v, c) for v, c in match.chunk.items()]


def _place_minimums(match, options, rnd):
    """Give each chunk its minimum of receivers, scarcest chunk first."""
    load = {}
    for senders in match.send.values():
        for g in senders:
            load[g] = load.get(g, 0) + 1
    for c in sorted(match.send, key=lambda c: -match.need[c] / max(1, len(match.send[c]))):
        srcs = sorted((g for g in match.send[c] if g not in match.receiver), key=load.__getitem__)
        dsts = [g for g, opts in options.items() if c in opts and g not in match.chunk]
        rnd.shuffle(dsts)
        for u, v in list(zip(srcs, dsts))[: match.need[c]]:
            match.assign(u, v, c)


class _Match:
    """Receivers matched to a chunk and a sender, and each chunk's count.

    ``send[c]`` lists the ranks that can send chunk c this round.  A sender,
    once busy, stays busy (it may only switch receivers), so a cursor per
    chunk finds free senders in amortized constant time.
    """

    def __init__(self, need, send):
        self.need, self.send = need, send
        self.cursor = dict.fromkeys(send, 0)
        self.chunk = {}  # receiver -> chunk
        self.sender = {}  # receiver -> sender
        self.receiver = {}  # sender -> receiver
        self.flow = dict.fromkeys(need, 0)

    def assign(self, u, v, c):
        """Sender u copies chunk c to v, taking u from whomever it served."""
        old = self.receiver.get(u)
        if old is not None:
            self.flow[self.chunk.pop(old)] -= 1
            del self.sender[old]
        self.chunk[v], self.sender[v], self.receiver[u] = c, u, v
        self.flow[c] += 1

    def free_sender(self, c):
        """A rank that can send chunk c and sends nothing yet, or None."""
        senders, i = self.send[c], self.cursor[c]
        while i < len(senders) and senders[i] in self.receiver:
            i += 1
        self.cursor[c] = i
        return senders[i] if i < len(senders) else None

    def augment(self, v0, options):
        """Serve v0 along a shortest augmenting path, if there is one.

        A step gives receiver v chunk c from sender u; if u served w, w
        needs a new sender, unless that would take w's chunk below its
        minimum (then the step is not taken).  Each chunk is expanded once.
        """
        prev = {v0: None}
        expanded = set()
        queue = deque([v0])
        while queue:
            v = queue.popleft()
            for c in options[v]:
                u = self.free_sender(c)
                if u is not None:
                    path = [(v, c, u)]
                    while prev[path[-1][0]] is not None:
                        path.append(prev[path[-1][0]])
                    for step_v, step_c, step_u in reversed(path):
                        self.assign(step_u, step_v, step_c)
                    return
            for c in options[v]:
                if c in expanded:
                    continue
                expanded.add(c)
                for u in self.send[c]:
                    w = self.receiver[u]
                    kept = self.chunk[w]
                    if w not in prev and (kept == c or self.flow[kept] > self.need[kept]):
                        prev[w] = (v, c, u)
                        queue.append(w)
