"""How a buffer of n elements is cut into p blocks, one per rank."""

__all__ = ["block_offsets"]


def block_offsets(numel: int, parts: int) -> list[int]:
    """Offsets of ``parts`` near-equal blocks covering ``numel`` elements.

    Block ``i`` is ``[offsets[i], offsets[i + 1])``; the first
    ``numel % parts`` blocks hold one element more (the layout of
    ``numpy.array_split``).  Blocks are empty when ``numel < parts``.
    ReduceScatter leaves block ``i`` on rank ``i``; Allgather expects it there.
    """
    base, extra = divmod(numel, parts)
    return [i * base + min(i, extra) for i in range(parts + 1)]
