"""Group allreduce over the butterfly groups of WAGMA-SGD (Algorithm 1)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Literal

from ..agreement import check_arguments
from ..buffers import BufferT, FlatBuffer, describe
from ..schedules.blocking import SMALL_ALLREDUCE_BYTES, Op, reduction_problem
from .groups import ButterflyGrouping

if TYPE_CHECKING:
    from ..comm import Communicator

__all__ = [
    "GROUP_ALLREDUCE_ALGORITHMS",
    "GroupAllreduceAlgorithm",
    "GroupAllreduceSchedule",
    "butterfly_halving_doubling",
    "butterfly_recursive_doubling",
    "choose_group_allreduce",
    "group_allreduce",
]

#: Default tag of the blocking group allreduce on the data channel.  The
#: wait-avoiding collective passes tags that encode the version instead.
TAG_GROUP = 31

#: The butterfly schedules, the keys of :data:`GROUP_ALLREDUCE_ALGORITHMS`.
GroupAllreduceSchedule = Literal["recursive_doubling", "halving_doubling"]
#: What ``group_allreduce(algorithm=...)`` accepts: a schedule or ``"auto"`` (:func:`choose_group_allreduce`).
GroupAllreduceAlgorithm = Literal[GroupAllreduceSchedule, "auto"]


def butterfly_recursive_doubling(
    buf: FlatBuffer,
    comm: Communicator,
    masks: Sequence[int],
    scale: float | None = None,
    tag: int = TAG_GROUP,
    src: FlatBuffer | None = None,
) -> None:
    """Sum over the group spanned by ``masks`` into ``buf``, whole buffer per phase.

    One phase per mask (WAGMA Algorithm 1): exchange the whole buffer with
    ``rank ^ mask`` and add.  log2 S messages of the full size: the schedule
    for small buffers.  Partners compute a + b and b + a, bitwise equal.
    The inputs are ``src`` when given (only read), else ``buf`` itself (in
    place).  Out of place, the first phase sends ``src``, receives the
    partner's buffer straight into ``buf`` and adds ``src`` to it: the
    memory traffic of the in-place phase (which receives into scratch), so
    out of place costs nothing extra.
    """
    if not masks:
        if src is not None:
            buf.copy_(src)
    else:
        scratch = None
        for phase, mask in enumerate(masks):
            peer = comm.rank ^ mask
            if phase == 0 and src is not None:
                comm.exchange(src.msg(0, buf.numel), peer, buf.msg(0, buf.numel), peer, tag)
                buf.add_(0, buf.numel, src)
                continue
            if scratch is None:
                scratch = buf.scratch(buf.numel)
            comm.exchange(buf.msg(0, buf.numel), peer, scratch.msg(0, buf.numel), peer, tag)
            buf.add_(0, buf.numel, scratch)
    if scale is not None:
        buf.scale_(0, buf.numel, scale)


def butterfly_halving_doubling(
    buf: FlatBuffer,
    comm: Communicator,
    masks: Sequence[int],
    scale: float | None = None,
    tag: int = TAG_GROUP,
    src: FlatBuffer | None = None,
) -> None:
    """Sum over the group spanned by ``masks`` into ``buf``, halving then doubling.

    The group's phases in order halve the buffer (a rank keeps the half on
    its side of the phase's mask and adds its partner's copy of it), leaving
    1/S of the buffer reduced over the group on each member; the phases in
    reverse order double it back.  2 log2 S messages, 2 (S - 1)/S of the
    buffer sent: the schedule for large buffers.  Each element is reduced on
    one rank and copied, so group members agree bitwise.  ``src`` as for
    :func:`butterfly_recursive_doubling`: the first phase receives the
    partner's copy of the kept half straight into ``buf`` and adds ``src``'s
    to it; every element of ``buf`` is written by a reduction or a receive.
    """
    if not masks:
        butterfly_recursive_doubling(buf, comm, masks, scale, tag, src)
        return
    rank = comm.rank
    lo, hi = 0, buf.numel
    windows = []
    scratch = None
    for phase, mask in enumerate(masks):
        windows.append((lo, hi))
        mid = lo + (hi - lo) // 2
        (slo, shi), (lo, hi) = ((lo, mid), (mid, hi)) if rank & mask else ((mid, hi), (lo, mid))
        if phase == 0 and src is not None:
            comm.exchange(src.msg(slo, shi), rank ^ mask, buf.msg(lo, hi), rank ^ mask, tag)
            buf.add_(lo, hi, src, at=lo)
            continue
        if scratch is None:
            scratch = buf.scratch(hi - lo)
        comm.exchange(buf.msg(slo, shi), rank ^ mask, scratch.msg(0, hi - lo), rank ^ mask, tag)
        buf.add_(lo, hi, scratch)
    if scale is not None:
        buf.scale_(lo, hi, scale)
    for mask, (wlo, whi) in zip(reversed(masks), reversed(windows)):
        # The partner holds the other half of the window split in this phase.
        olo, ohi = (wlo, lo) if lo > wlo else (hi, whi)
        comm.exchange(buf.msg(lo, hi), rank ^ mask, buf.msg(olo, ohi), rank ^ mask, tag)
        lo, hi = wlo, whi


#: The group allreduce schedules, by the name ``group_allreduce(algorithm=...)`` takes.
GROUP_ALLREDUCE_ALGORITHMS: dict[GroupAllreduceSchedule, Callable[..., None]] = {
    "recursive_doubling": butterfly_recursive_doubling,
    "halving_doubling": butterfly_halving_doubling,
}


def choose_group_allreduce(nbytes: int) -> GroupAllreduceSchedule:
    """The schedule ``algorithm="auto"`` runs: recursive doubling below
    :data:`~collectives.schedules.blocking.SMALL_ALLREDUCE_BYTES`, else halving/doubling."""
    return "recursive_doubling" if nbytes < SMALL_ALLREDUCE_BYTES else "halving_doubling"


def group_allreduce(
    data: BufferT,
    *,
    comm: Communicator,
    group_size: int,
    t: int,
    op: Op = "sum",
    algorithm: GroupAllreduceAlgorithm = "auto",
    dynamic_groups: bool = True,
    check: bool = True,
) -> BufferT:
    """Reduce ``data`` within this rank's butterfly group of iteration ``t``.

    The ``comm.size`` = P ranks form P / S groups of ``group_size`` = S ranks
    (:class:`~collectives.wait_avoiding.groups.ButterflyGrouping`, WAGMA Algorithm 1, which
    changes the groups with ``t``; with ``dynamic_groups=False`` iteration
    0's groups at every ``t``).  On return every member of a group holds
    the sum (or mean, ``op="avg"``) of the group's inputs, bitwise equal
    within the group.  This is the blocking group allreduce; all ranks call it
    with the same ``t``.

    Args:
        data: contiguous numpy array or torch tensor, as for
            :func:`~collectives.schedules.blocking.allreduce`.
        comm: a :class:`~collectives.comm.Communicator` whose size is a
            power of two.
        group_size: S, a power of two <= P.
        t: the iteration (>= 0) whose grouping is used.
        op: ``"sum"`` or ``"avg"`` (divides by S).
        algorithm: ``"recursive_doubling"``, ``"halving_doubling"`` or
            ``"auto"`` (recursive doubling below
            :data:`~collectives.schedules.blocking.SMALL_ALLREDUCE_BYTES`).
        dynamic_groups: Algorithm 1's groups of iteration ``t`` (default);
            False: the groups of iteration 0 whatever ``t`` (the same log2 S
            hypercube dimensions at every iteration: WAGMA's ablation 2,
            section 5.2, "the groups are fixed").
        check: agree on the arguments across ranks first.

    Raises:
        ValueError, TypeError: on every rank, before any data moves.
    """
    info = describe(data)
    problem, error = info.problem, info.error
    try:
        if not isinstance(dynamic_groups, bool):
            raise TypeError(f"dynamic_groups must be True or False, got {dynamic_groups!r}")
        masks = ButterflyGrouping(comm.size, group_size, dynamic_groups).masks(t)
    except (TypeError, ValueError) as exc:
        problem, error = problem or str(exc), error if problem else type(exc)
        masks = ()
    if algorithm == "auto" and not problem:
        algorithm = choose_group_allreduce(data.nbytes)
    problem = problem or reduction_problem(info, algorithm, GROUP_ALLREDUCE_ALGORITHMS, op)
    check_arguments(
        comm,
        "group_allreduce",
        problem,
        error,
        check,
        numel=info.numel,
        dtype=info.dtype,
        algorithm=algorithm,
        op=op,
        group_size=group_size,
        t=t,
        dynamic_groups=dynamic_groups,
    )
    assert algorithm != "auto"  # chosen above unless a problem, which check_arguments raised
    schedule = GROUP_ALLREDUCE_ALGORITHMS[algorithm]
    with comm.open_buffer(data) as buf:
        schedule(buf, comm, masks, 1.0 / group_size if op == "avg" else None)
    return data
