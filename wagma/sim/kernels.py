"""The simulator's per-algorithm recurrences, compiled with numba.

Every kernel takes ``compute[P, T]`` (seconds of rank r's step t: the base
compute plus the injected delay, or the drawn time) and returns
``clock[P, T]``: when rank r ends step t, i.e. leaves the algorithm's
``step()`` and starts step t + 1.  Step t of rank r starts at
``clock[r, t - 1]`` (0 for t = 0), so its arrival at the communication is
``f = clock[r, t - 1] + compute[r, t]`` and everything after it,
``clock[r, t] - f``, is waiting and transfers.  Kernels of algorithms that
average contributions of different ages also fill ``stale[P, T]`` (1 when
rank r's contribution to step t's averaging was not its step-t one) and
``age[P, T]`` (how many steps old the contribution was; NaN where the rank
averaged nothing).

The state is arrays of P floats per step: no events, no Python objects.
Each algorithm's rule of who waits for whom is in its kernel's docstring.

The global synchronizations of :func:`local_sgd` and :func:`wagma` (hence
Allreduce-SGD, local SGD and WAGMA-SGD's every-tau average) can run with the
runtime's straggler prediction (``--sync stragglar``): the rule of
:mod:`collectives.stragglar.prediction`, its own two functions compiled
here, fed with the simulated arrivals (``_synchronize``).
"""

import hashlib
import inspect
import os
from typing import TypeAlias

import numpy as np
from numba import njit

from collectives.stragglar.prediction import predicted_rank, update_scores
from wagma.options.algorithms import Late

from .network import AllreduceCost

__all__ = [
    "Predictor",
    "SYNC_FIELDS",
    "adpsgd",
    "eager_sgd",
    "ensemble_sync",
    "hierarchical_sgd",
    "local_sgd",
    "neighbours",
    "no_prediction",
    "plan_scores",
    "streaming",
    "wagma",
]

#: The columns of the per-synchronization record of a predicted run (the
#: runtime's log, :class:`collectives.stragglar.training_sync.PredictedStragglerSync`,
#: without its first, the synchronization's number).
SYNC_FIELDS = ("predicted", "last", "lead_s", "min_lead_s")

#: The prediction arguments of :func:`local_sgd` and :func:`wagma`:
#: ``(on, decay, confidence, first_min_lead_s, min_lead_s, first_plan_s,
#: new_plan_s, cached_plans)`` (see ``_synchronize``).
Predictor: TypeAlias = tuple[bool, float, float, float, float, float, float, float]

_update_scores = njit(cache=True)(update_scores)
_predicted_rank = njit(cache=True)(predicted_rank)


@njit(cache=True)
def _global_end(f, straggler, after_last, straggler_aware, reduce_scatter, after_straggler):
    """End of a blocking allreduce over all ranks that arrive at times ``f``
    (see :class:`wagma.sim.network.GlobalAllreduce`).  StragglAR is planned
    with rank ``straggler``: the n - 1 others' ReduceScatter starts when the
    last of them arrives, the rounds when it is done and ``straggler`` is
    there.  Planned for the rank that really arrives last, the ReduceScatter
    hides behind its delay; planned for another one, the late rank is among
    the ReduceScatter's and nothing of its delay is hidden."""
    if not straggler_aware:
        return f.max() + after_last
    others = -np.inf
    for r in range(f.size):
        if r != straggler and f[r] > others:
            others = f[r]
    return max(others + reduce_scatter, f[straggler]) + after_straggler


def no_prediction(ranks: int) -> tuple[Predictor, np.ndarray, np.ndarray]:
    """The prediction arguments of :func:`local_sgd` and :func:`wagma` for a
    run without it (every synchronization runs ``collective``)."""
    return (False, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0), plan_scores(ranks), np.zeros((0, len(SYNC_FIELDS)))


def plan_scores(ranks: int) -> np.ndarray:
    """The ``scores`` of ``_synchronize`` before the first synchronization:
    no frequency, no lead, no plan held."""
    scores = np.zeros((3, ranks))
    scores[2] = -1.0
    return scores


@njit(cache=True)
def _synchronize(f, since, k, collective, planned, predictor, scores, record):
    """End of global synchronization ``k``, which the ranks reach at ``f``;
    the previous one ended at ``since`` (0 for the first).

    Without prediction (``predictor[0]`` False): ``collective``, StragglAR
    planned for the last rank to arrive if it is straggler-aware (the
    oracle of ``--collective stragglar``).  With it: ``predictor`` is
    :data:`Predictor` and ``scores`` the predictor's ``[frequency,
    lead_seconds]``, folded in from synchronizations 0 .. k - 1; its
    prediction p runs StragglAR planned for p (``planned``), no prediction
    (-1) runs ``collective``.  Then the arrivals ``f - since`` (each rank's
    seconds from leaving the previous synchronization to reaching this one)
    are folded in, and row k of ``record`` is (p, the last rank, its lead,
    the lead the next prediction requires).  That is ``first_min_lead_s``
    after the first synchronization and ``min_lead_s`` after the others:
    the runtime (:class:`collectives.stragglar.training_sync.PredictedStragglerSync`)
    sets it from the allreduce's time once it has measured one.

    Plans, as the runtime makes them: at the end of synchronization k,
    while every rank is there, the ranks build the plan of the next
    prediction unless they hold it, which adds ``first_plan_s`` (the job's
    first plan) or ``new_plan_s`` to the end.  They hold the plans of the
    ``cached_plans`` predictions used or built most recently; row 2 of
    ``scores`` says when each rank's plan was last used or built (2k and
    2k + 1 at synchronization k; -1: never).
    """
    if not predictor[0]:
        return _global_end(f, np.argmax(f), *collective)
    gate = predictor[3] if k <= 1 else predictor[4]
    p = _predicted_rank(scores[0], scores[1], predictor[2], gate)
    used = scores[2]
    if p >= 0:
        end = _global_end(f, p, *planned)
        used[p] = 2 * k
    else:
        end = _global_end(f, np.argmax(f), *collective)
    last, lead = _update_scores(scores[0], scores[1], f - since, predictor[1])
    following = _predicted_rank(scores[0], scores[1], predictor[2], predictor[3] if k == 0 else predictor[4])
    if following >= 0:
        if used[following] < 0 or np.sum(used > used[following]) >= predictor[7]:
            end += predictor[5] if used.max() < 0 else predictor[6]
        used[following] = 2 * k + 1
    record[k, 0] = p
    record[k, 1] = last
    record[k, 2] = lead
    record[k, 3] = predictor[3] if k == 0 else predictor[4]
    return end


def _forget_kernels_of_another_predictor(kernels):
    """numba's cache knows a kernel's own file only: a kernel that inlines
    :func:`update_scores` and :func:`predicted_rank` would be loaded from the
    cache as compiled with an older version of them.  Flush those kernels'
    cache entries whenever the predictor's source has changed since they
    were cached (a digest of it beside the cache)."""
    source = inspect.getsource(update_scores) + inspect.getsource(predicted_rank)
    digest = hashlib.sha256(source.encode()).hexdigest()
    folder = kernels[0].stats.cache_path
    path = os.path.join(folder, "wagma_sim_straggler_prediction.sha256")
    try:
        with open(path) as f:
            if f.read() == digest:
                return
    except OSError:
        pass
    try:
        os.makedirs(folder, exist_ok=True)
        for kernel in kernels:
            kernel._cache.flush()
        with open(path, "w") as f:
            f.write(digest)
    except OSError:  # a cache that cannot be written is not reused either
        pass


@njit(cache=True)
def local_sgd(
    compute: np.ndarray,
    tau: int,
    collective: AllreduceCost,
    planned: AllreduceCost,
    predictor: Predictor,
    scores: np.ndarray,
    record: np.ndarray,
) -> np.ndarray:
    """Model averaging over all ranks at steps with (t + 1) mod tau == 0
    (a barrier: the last rank's arrival, then the allreduce); no waiting in
    between.  tau = 1 is synchronous model averaging, and Allreduce-SGD too:
    every rank waits for the last one, then the gradient allreduce (its
    buckets one after another in ``collective``; emulated compute has no
    backward pass for them to overlap with).  The synchronizations run as
    ``_synchronize`` says (``planned``, ``predictor``, ``scores``,
    ``record``: see there, or :func:`no_prediction`)."""
    ranks, steps = compute.shape
    clock = np.empty((ranks, steps))
    done = np.zeros(ranks)
    since = 0.0
    for t in range(steps):
        f = done + compute[:, t]
        if (t + 1) % tau == 0:
            since = _synchronize(f, since, t // tau, collective, planned, predictor, scores, record)
            done[:] = since
        else:
            done[:] = f
        clock[:, t] = done
    return clock


@njit(cache=True)
def streaming(compute: np.ndarray, period: int, offsets: np.ndarray, overlap: int, cost: float) -> np.ndarray:
    """Streaming DiLoCo's fragments: after step t with (t + 1) mod H equal
    to fragment p's offset, the fragment's average starts once every rank
    has started it (the last one's end of step t) and the worker thread is
    free (the exchanges run one after another, in order), and takes
    ``cost``; each rank waits for it at the end of step t + ``overlap``
    (at once with 0).  An exchange still in flight at the end of the run is
    not waited for."""
    ranks, steps = compute.shape
    clock = np.empty((ranks, steps))
    done = np.zeros(ranks)
    lands = np.full(steps + period, -1.0)  # the end of the exchange a rank waits for after step t
    free = 0.0
    for t in range(steps):
        done = done + compute[:, t]
        if lands[t] >= 0.0:
            done = np.maximum(done, lands[t])
        for p in range(offsets.shape[0]):
            if (t + 1) % period == offsets[p]:
                free = max(done.max(), free) + cost
                if overlap == 0:
                    done[:] = free
                else:
                    lands[t + overlap] = free
        clock[:, t] = done
    return clock


@njit(cache=True)
def hierarchical_sgd(
    compute: np.ndarray,
    periods: np.ndarray,
    sizes: np.ndarray,
    costs: np.ndarray,
    warmup: int,
    collective: AllreduceCost,
) -> np.ndarray:
    """Hierarchical SGD: during the first ``warmup`` steps a gradient
    allreduce over all ranks (``collective``); afterwards, at steps t with
    t mod period == 0 for some level, the level with the largest period
    averages within its groups of ``size`` consecutive ranks (each group waits
    for its last member, then ``costs[level]``; a level of all P ranks costs
    ``collective``).  Levels are given in increasing period."""
    ranks, steps = compute.shape
    clock = np.empty((ranks, steps))
    done = np.zeros(ranks)
    for t in range(steps):
        f = done + compute[:, t]
        if t < warmup:
            done[:] = _global_end(f, np.argmax(f), *collective)
        else:
            level = -1
            for i in range(periods.size):
                if t % periods[i] == 0:
                    level = i
            if level < 0:
                done[:] = f
            elif sizes[level] >= ranks:
                done[:] = _global_end(f, np.argmax(f), *collective)
            else:
                size = sizes[level]
                for first in range(0, ranks, size):
                    end = f[first : first + size].max() + costs[level]
                    done[first : first + size] = end
        clock[:, t] = done
    return clock


@njit(cache=True)
def neighbours(compute: np.ndarray, offsets: np.ndarray, exchange: float) -> np.ndarray:
    """Synchronous gossip: at step t rank r receives from ranks r - o for each
    offset o in ``offsets[t]`` and waits for them, then spends ``exchange``
    (its sends).  D-PSGD: offsets (1, -1), the two ring neighbours, every
    step; SGP: the out-peers 2**k of its exponential graph, in-peers r - 2**k."""
    ranks, steps = compute.shape
    clock = np.empty((ranks, steps))
    done = np.zeros(ranks)
    for t in range(steps):
        f = done + compute[:, t]
        for r in range(ranks):
            start = f[r]
            for j in range(offsets.shape[1]):
                start = max(start, f[(r - offsets[t, j]) % ranks])
            done[r] = start + exchange
        clock[:, t] = done
    return clock


@njit(cache=True)
def adpsgd(compute: np.ndarray, exchange: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """AD-PSGD (our :class:`~collectives.gossip.PairwiseGossip`): after its
    step k an active rank (:func:`~collectives.gossip.active_ranks`: the even
    ones, but P - 1 on an odd ring) asks a passive neighbour for an exchange,
    right at even k and left at odd k, so each passive rank gets one request
    per step (every other step for ranks P - 2 and P - 1 of an odd ring).  An
    exchange (``exchange`` seconds: the model there and back) starts when the
    request is made and both ranks' communication threads are free; a rank
    starts step k + 1 once its exchange of step k - 1 is done (staleness
    bound 1; a rank with no exchange at step k - 1 waits for its latest).  Reading chosen: a passive thread serves its
    requests in step order (the runtime serves them in arrival order, which
    can only make a passive rank wait less).

    Returns ``clock`` and ``age``: at each exchange the difference between the
    two ranks' step counts (filled for both ranks at the active's step); and
    for :mod:`wagma.emulate`, ``partner``, ``begin`` (rows of the active
    ranks: the passive rank and the start of the exchange each asked for
    after its step k) and ``finish`` (the end of each step's compute).
    """
    ranks, steps = compute.shape
    clock = np.empty((ranks, steps))
    finish = np.empty((ranks, steps))  # end of each step's compute
    start_at = np.empty((ranks, steps))  # when step k's exchange began (row of the active)
    partner = np.empty((ranks, steps), dtype=np.int64)
    exchanged = np.zeros(ranks)  # end of each rank's latest exchange
    previous = np.zeros(ranks)  # end of its exchange of step k - 1
    done = np.zeros(ranks)
    for k in range(steps):
        f = done + compute[:, k]
        finish[:, k] = f
        for r in range(ranks):  # step k + 1 waits for the exchange of step k - 1
            done[r] = max(f[r], previous[r])
        if ranks > 1:
            for a in range(0, ranks - ranks % 2, 2):  # active_ranks(ranks)
                p = (a + 1) % ranks if k % 2 == 0 else (a - 1) % ranks
                begin = max(f[a], exchanged[a], exchanged[p])
                exchanged[a] = exchanged[p] = begin + exchange
                start_at[a, k] = begin
                partner[a, k] = p
            previous[:] = exchanged
        clock[:, k] = done
    age = np.full((ranks, steps), np.nan)
    if ranks > 1:
        for a in range(0, ranks - ranks % 2, 2):
            for k in range(steps):
                p = partner[a, k]
                begin = start_at[a, k]
                mine = np.searchsorted(finish[a], begin, side="right")
                theirs = np.searchsorted(finish[p], begin, side="right")
                age[a, k] = age[p, k] = abs(mine - theirs)
    return clock, age, partner, start_at, finish


#: The ``late`` readings of :func:`eager_sgd` by code, those of
#: :data:`collectives.wait_avoiding.collective.LATE`, in its order.
LATE_CODES: dict[Late, int] = {"drop": 0, "newest": 1, "accumulate": 2}


@njit(cache=True)
def eager_sgd(
    compute: np.ndarray,
    quorum: int,
    activators: np.ndarray,
    synchronous: np.ndarray,
    activation: float,
    cost: float,
    late: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Eager-SGD's partial allreduce over all ranks.  Version t starts when
    its activator ``activators[t]`` has arrived (the majority's random
    activator), or, where that is -1, when ``quorum`` ranks have arrived
    (1: solo, ceil(P/2): half), plus the activation's ``activation``
    seconds; a ``synchronous[t]`` version (the limiter's) when every rank
    has arrived, with no activation; and not before version t - 1 ended.
    It takes ``cost``.  A rank that arrives after the start is stale (its
    gradient of step t is not in version t; what becomes of it, the
    ``late`` reading, changes values, not times), with the newest gradient
    it had published by then ``age`` steps old, and does not wait for the
    others; every rank leaves when it has arrived and the version has
    ended.

    Also returns ``taken[P, T]``: the version that read rank r's gradient
    of step s, -1 where none did, as the runtime consumes contributions
    under the ``late`` reading (:data:`LATE_CODES`): a gradient is published
    when its rank arrives, and the first version to begin after that reads
    every gradient still unread; one published after its own version began
    is dropped (0), or read unless a newer one replaces it first (1), or
    summed with the newer ones (2).  A fresh gradient is read by its own
    version under every reading."""
    ranks, steps = compute.shape
    clock = np.empty((ranks, steps))
    stale = np.zeros((ranks, steps))
    age = np.zeros((ranks, steps))
    finish = np.empty((ranks, steps))
    begins = np.empty(steps)
    done = np.zeros(ranks)
    ended = 0.0
    for t in range(steps):
        f = done + compute[:, t]
        finish[:, t] = f
        if synchronous[t]:
            trigger = f.max()
        elif activators[t] >= 0:
            trigger = f[activators[t]] + activation
        else:
            trigger = np.partition(f, quorum - 1)[quorum - 1] + activation
        begin = max(trigger, ended)
        begins[t] = begin
        ended = begin + cost
        for r in range(ranks):
            if f[r] > begin:
                stale[r, t] = 1.0
                s = t - 1
                while s >= 0 and finish[r, s] > begin:
                    s -= 1
                age[r, t] = t - s
            done[r] = max(f[r], ended)
        clock[:, t] = done
    return clock, stale, age, _taken(finish, begins, late)


@njit(cache=True)
def _taken(finish, begins, late):
    """:func:`eager_sgd`'s ``taken`` from the publications ``finish[r, s]``
    and the versions' beginnings ``begins[v]`` (the same on every rank)."""
    ranks, steps = finish.shape
    taken = np.full((ranks, steps), -1, dtype=np.int64)
    unread = np.empty(steps, dtype=np.int64)
    for r in range(ranks):
        count, s = 0, 0
        for v in range(steps):
            # Gradients are published in step order, and step v's before version v + 1 begins.
            while s <= v and finish[r, s] <= begins[v]:
                if late == 2:
                    unread[count] = s
                    count += 1
                elif late == 1 or finish[r, s] <= begins[s]:
                    unread[0] = s
                    count = 1
                s += 1
            for i in range(count):
                taken[r, unread[i]] = v
            count = 0
    return taken


@njit(cache=True)
def _popcount(x):
    count = 0
    while x:
        x &= x - 1
        count += 1
    return count


@njit(cache=True)
def _hops(rank, root, ranks):
    """Levels of the activation tree rooted at ``root`` down to ``rank``
    (:class:`~collectives.wait_avoiding.activation.ActivationState`): the
    bits of the relative rank, ``rank ^ root`` on a hypercube (P a power of
    two), ``(rank - root) mod P`` otherwise."""
    if ranks & (ranks - 1) == 0:
        return _popcount(rank ^ root)
    return _popcount((rank - root) % ranks)


@njit(cache=True)
def wagma(
    compute: np.ndarray,
    tau: int,
    masks: np.ndarray,
    hosts: np.ndarray,
    phases: np.ndarray,
    phase_costs: np.ndarray,
    fold_cost: float,
    activation: bool,
    hop: float,
    collective: AllreduceCost,
    planned: AllreduceCost,
    predictor: Predictor,
    scores: np.ndarray,
    record: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """WAGMA-SGD's wait-avoiding group allreduce (Algorithm 2; DESIGN
    "The wait-avoiding group allreduce").

    Version t (not a sync step) starts on rank r at
    ``max(end of version t - 1 on r, min(f_r, f_a + hop * levels(r, a)))``:
    the first rank a to arrive activates it along the binomial tree rooted at
    itself (one ``hop`` per tree level, ``_hops``), and r's own arrival
    activates it too.  Then the group allreduce of iteration t, as
    :class:`~collectives.wait_avoiding.groups.ButterflyGrouping` gives it over
    one period of iterations (``masks[t mod L]``, ``hosts[t mod L]``; the
    paper's fixed groups of ablation 2 are a period of one iteration): the
    folded ranks (P not a power of two; rank ``core + j`` is folded into
    ``hosts[t mod L, j]``) hand over their buffer (``fold_cost``); in phase k
    each core rank r and its partner r ^ masks[t mod L, phases[k]] both start
    when both are ready and take ``phase_costs[k]``; then each host hands
    the result back (``fold_cost``).
    A rank whose version started before it arrived is stale (however small
    the gap: a rank whose partner of the previous version started late by a
    hop arrives late by as much, and the runtime has the same race): its
    contribution is the last one it published before the version began on
    it, as the runtime's progress thread reads it (a group version's W'_s is
    published at the rank's arrival at s, fresh or not; a sync step's
    average when the sync step ends; the initial model, iteration -1, at 0);
    it leaves once it has arrived and the version has ended on it.  At sync steps ((t + 1) mod tau == 0) a blocking
    allreduce over all ranks (``collective``, or as ``_synchronize``
    says with a prediction) and everyone is fresh.
    Without ``activation`` (Algorithm 2's beta: blocking group averaging) a
    version starts on a rank only when the rank arrives, so every phase
    waits for the partner's arrival and nobody is stale.

    Returns ``clock``, ``stale``, ``age`` and ``source``: the iteration of
    the contribution rank r gave to version t (t where fresh, -1 for the
    initial model), which :mod:`wagma.emulate` replays; ``age`` is
    ``t - source``.
    """
    ranks, steps = compute.shape
    clock = np.empty((ranks, steps))
    stale = np.zeros((ranks, steps))
    age = np.zeros((ranks, steps))
    source = np.empty((ranks, steps), dtype=np.int64)
    published = np.empty((ranks, steps))  # when rank r published its contribution of iteration s
    done = np.zeros(ranks)
    version_end = np.zeros(ranks)
    began = np.empty(ranks)
    ready = np.empty(ranks)
    paired = np.empty(ranks)
    extras = hosts.shape[1]
    core = ranks - extras
    since = 0.0
    for t in range(steps):
        f = done + compute[:, t]
        if (t + 1) % tau == 0:
            since = _synchronize(f, since, t // tau, collective, planned, predictor, scores, record)
            done[:] = since
            version_end[:] = done
            published[:, t] = since
            source[:, t] = t
        else:
            first = np.argmin(f)
            for r in range(ranks):
                reached = f[first] + hop * _hops(r, first, ranks) if activation else f[r]
                began[r] = max(version_end[r], min(f[r], reached))
            ready[:] = began
            i = t % masks.shape[0]
            for j in range(extras):
                host = hosts[i, j]
                ready[host] = max(ready[host], ready[core + j]) + fold_cost
            for k in range(phases.size):
                mask = masks[i, phases[k]]
                for r in range(core):
                    paired[r] = max(ready[r], ready[r ^ mask]) + phase_costs[k]
                ready[:core] = paired[:core]
            for j in range(extras):
                ready[core + j] = ready[hosts[i, j]] + fold_cost
            for r in range(ranks):
                published[r, t] = f[r]
                s = t
                while s >= 0 and published[r, s] > began[r]:
                    s -= 1
                source[r, t] = s
                if s < t:
                    stale[r, t] = 1.0
                    age[r, t] = t - s
                version_end[r] = ready[r]
                done[r] = max(f[r], ready[r])
        clock[:, t] = done
    return clock, stale, age, source


@njit(cache=True)
def ensemble_sync(
    compute: np.ndarray, period: int, timeout: float, costs: np.ndarray, notify: float
) -> tuple[np.ndarray, np.ndarray]:
    """EnsembleSync (:class:`wagma.algorithms.ensemble_sync.EnsembleSync`): rounds of
    ``period`` steps; a round closes when every present rank has reported,
    or ``timeout`` after its first report (the last round: when every rank
    has, late ones included).  The ranks that reported by then average at
    ``close + costs[m] + notify / 2`` (m members: the binomial tree among
    them; ``notify``: the report to the coordinator and its decision back);
    the others are late: they report when they arrive, join the first round
    that closes after that with weight 0, and skip its steps (returned in
    ``skipped[P, T]``, their clock is the join's end).  A late rank is not
    waited for until it has rejoined.  Returns ``(clock, skipped)``."""
    ranks, steps = compute.shape
    clock = np.empty((ranks, steps))
    skipped = np.zeros((ranks, steps))
    done = np.zeros(ranks)
    late = np.full(ranks, -1.0)  # a late rank's report time, -1 while present
    rejoin_from = np.zeros(ranks, np.int64)  # the first step a late rank will skip
    start = 0
    while start < steps:
        end = min(start + period, steps)
        arrival = np.full(ranks, np.inf)
        first, last = np.inf, -np.inf
        for r in range(ranks):
            if late[r] < 0:
                t = done[r]
                for s in range(start, end):
                    t += compute[r, s]
                    clock[r, s] = t
                arrival[r] = t + notify / 2
                first, last = min(first, arrival[r]), max(last, arrival[r])
        if end == steps:
            close = last
            for r in range(ranks):
                if late[r] >= 0:
                    close = max(close, late[r])
        elif last - first <= timeout:
            close = last
        else:
            close = first + timeout
        taking_part = 0
        for r in range(ranks):
            if (late[r] < 0 and arrival[r] <= close) or (late[r] >= 0 and late[r] <= close):
                taking_part += 1
        finish = close + costs[taking_part] + notify / 2
        for r in range(ranks):
            if late[r] < 0:
                if arrival[r] <= close:
                    clock[r, end - 1] = finish
                    done[r] = finish
                else:  # late: its report arrives after the close
                    late[r] = arrival[r]
                    rejoin_from[r] = end
            elif late[r] <= close:  # rejoins with weight 0, skipping to this round's end
                clock[r, rejoin_from[r] - 1] = finish
                for s in range(rejoin_from[r], end):
                    clock[r, s] = finish
                    skipped[r, s] = 1.0
                done[r] = finish
                late[r] = -1.0
        start = end
    return clock, skipped


_forget_kernels_of_another_predictor((_synchronize, local_sgd, wagma))
