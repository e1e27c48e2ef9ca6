"""The alpha-beta cost of allreduce algorithms (StragglAR paper, Table 1)."""

import math

__all__ = [
    "PLAN_CHECK_S_PER_TRANSFER",
    "PLAN_READ_S_PER_TRANSFER",
    "PLAN_SELECT_S_PER_TRANSFER",
    "break_even_lead",
    "broadcast_time",
    "plan_time",
    "rhd_time",
    "ring_time",
    "stragglar_min_lead",
    "stragglar_time",
]

#: Seconds per transfer of the plan of n (n (n - 1) transfers) for a rank to
#: pick out its rounds for a new straggler
#: (:func:`collectives.stragglar.plans.rank_steps`): 3.0 ms at n = 1024 on
#: this project's 2-core machine (``results/stragglar_plans/plans_p8.h5``).
PLAN_SELECT_S_PER_TRANSFER = 2.9e-9
#: Seconds per transfer for rank 0 to read the plan of n from the plan
#: cache, its digest checked: 27 ms at n = 1024 (same source).
PLAN_READ_S_PER_TRANSFER = 2.6e-8
#: Seconds per transfer for a rank to check the digest of a plan it
#: received: 12 ms at n = 1024.
PLAN_CHECK_S_PER_TRANSFER = 1.1e-8


def ring_time(n: int, size: float, alpha: float, beta: float) -> float:
    """Ring: 2(n-1) alpha + 2(n-1)/n s beta."""
    return 2 * (n - 1) * alpha + 2 * (n - 1) / n * size * beta


def rhd_time(n: int, size: float, alpha: float, beta: float) -> float:
    """Recursive halving/doubling: 2 log2 n alpha + 2(n-1)/n s beta."""
    return 2 * math.log2(n) * alpha + 2 * (n - 1) / n * size * beta


def broadcast_time(n: int, size: float, alpha: float, beta: float) -> float:
    """Straggler-aware broadcast baseline: log2 n (alpha + s beta)."""
    return math.log2(n) * (alpha + size * beta)


def stragglar_time(n: int, size: float, alpha: float, beta: float, rounds: int) -> float:
    """StragglAR with a schedule of ``rounds`` rounds: R alpha + R/(n-1) s beta.

    Like the paper, it assumes the straggler's delay hides the ReduceScatter.
    """
    return rounds * alpha + rounds / (n - 1) * size * beta


def break_even_lead(n: int, rounds: int) -> float:
    """The straggler's lead, as a fraction of the ring allreduce's time, from
    which StragglAR with it as the straggler beats the ring (bandwidth terms
    of Table 1, large buffers).

    With the last rank ``L`` seconds after the others, the ring ends
    ``L + 2(n-1)/n s beta`` after the others' arrival; StragglAR ends
    ``max(RS, L) + R/(n-1) s beta`` with the others' ReduceScatter
    ``RS = (n-2)/(n-1) s beta``.  For ``L <= RS`` StragglAR is ahead when
    ``L > RS + R/(n-1) s beta - 2(n-1)/n s beta``; divided by the ring's
    time that is 1/3 at n = 4, 0.22 at n = 8, 0.14 at n = 16 (0 for n <= 2,
    where StragglAR is one exchange like the ring's).  Where the rounds
    alone, ``R/(n-1) s beta``, take as long as the ring or longer, no lead
    makes StragglAR win (beyond ``L = RS`` it is ``L + R/(n-1) s beta``
    against ``L + 2(n-1)/n s beta``): infinity (n = 3, 3 rounds).
    """
    if n <= 2:
        return 0.0
    ring = 2 * (n - 1) / n
    if rounds / (n - 1) >= ring:
        return math.inf
    return max(0.0, ((n - 2) / (n - 1) + rounds / (n - 1) - ring) / ring)


def stragglar_min_lead(reduce_scatter_s: float, rounds_s: float, tail_s: float) -> float:
    """The straggler's lead (seconds) from which StragglAR with it as the
    straggler ends before the fallback allreduce, whatever the message size.

    With the straggler ``L`` seconds after the others, StragglAR ends
    ``max(RS, L) + rounds`` after their arrival (``reduce_scatter_s`` and
    ``rounds_s``) and the fallback ``L + F`` (``tail_s``: what it still
    does once the last rank is there).  StragglAR is ahead when
    ``L > RS + rounds - F`` and ``rounds < F``; where its rounds alone take
    as long as the fallback's tail, no lead makes it win: infinity.  That
    is the small-message case: below some size the rounds' n + ceil(log2 n)
    - 2 message latencies (:func:`~collectives.stragglar.generator.lower_bound`)
    cost more than the library's log2 n, and StragglAR loses however late
    the straggler is.
    :func:`break_even_lead` is the same rule in Table 1's bandwidth terms.
    """
    if not rounds_s < tail_s:
        return math.inf
    return max(0.0, reduce_scatter_s + rounds_s - tail_s)


def plan_time(n: int, alpha: float, beta: float) -> tuple[float, float]:
    """``(first, new)``: the seconds every rank spends on the StragglAR plan
    of a newly predicted straggler (:mod:`collectives.stragglar.plans`):
    ``first`` for a job's first plan of n, ``new`` for any later straggler
    whose plan it does not hold.

    ``new``: each rank picks its rounds out of the n (n - 1) transfers, and
    the plan's construction agrees on its arguments and splits off the
    non-stragglers (three collectives of ceil(log2 n) messages).  ``first``
    adds rank 0's read of the plan cache (warm: a cold one adds the
    generation and verification, which ``collectives.bench plans``
    measures, once per machine), a binomial broadcast of its 16 bytes per
    transfer, and every rank's check of the digest.
    """
    if n <= 1:
        return 0.0, 0.0
    transfers = n * (n - 1)
    levels = math.ceil(math.log2(n))
    new = transfers * PLAN_SELECT_S_PER_TRANSFER + 3 * levels * alpha
    read = transfers * (PLAN_READ_S_PER_TRANSFER + PLAN_CHECK_S_PER_TRANSFER)
    first = new + read + levels * (alpha + 16 * transfers * beta)
    return first, new
