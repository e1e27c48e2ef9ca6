"""The alpha-beta cost of allreduce algorithms (StragglAR paper, Table 1)."""

import math

__all__ = ["broadcast_time", "rhd_time", "ring_time", "stragglar_time"]


def ring_time(n, size, alpha, beta):
    """Ring: 2(n-1) alpha + 2(n-1)/n s beta."""
    return 2 * (n - 1) * alpha + 2 * (n - 1) / n * size * beta


def rhd_time(n, size, alpha, beta):
    """Recursive halving/doubling: 2 log2 n alpha + 2(n-1)/n s beta."""
    return 2 * math.log2(n) * alpha + 2 * (n - 1) / n * size * beta


def broadcast_time(n, size, alpha, beta):
    """Straggler-aware broadcast baseline: log2 n (alpha + s beta)."""
    return math.log2(n) * (alpha + size * beta)


def stragglar_time(n, size, alpha, beta, rounds):
    """StragglAR with a schedule of ``rounds`` rounds: R alpha + R/(n-1) s beta.

    Like the paper, it assumes the straggler's delay hides the ReduceScatter.
    """
    return rounds * alpha + rounds / (n - 1) * size * beta
