"""The alpha-beta cost of allreduce algorithms (StragglAR paper, Table 1)."""

import math

__all__ = ["break_even_lead", "broadcast_time", "rhd_time", "ring_time", "stragglar_time"]


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
