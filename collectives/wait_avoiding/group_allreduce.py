"""Group allreduce over the butterfly groups of WAGMA-SGD (Algorithm 1).

Every message of one group allreduce carries one tag (:data:`TAG_GROUP`, or
the version's in the wait-avoiding collective), the fold's included: two
ranks that exchange twice (a phase of halving and one of doubling, a host
and its folded rank before and after the phases) post in the same order on
both sides, and MPI's non-overtaking rule matches them in that order.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Literal

from ..agreement import check_arguments
from ..buffers import BufferT, FlatBuffer, describe
from ..compression.allreduce import Compressor, compressed_group_schedule
from ..schedules.blocking import SMALL_ALLREDUCE_BYTES, Op, reduction_problem
from ..schedules.library import library_allreduce_flat
from .group_library import GroupCommunicators
from .groups import ButterflyGrouping, GroupPlan

if TYPE_CHECKING:
    from ..comm import Communicator

__all__ = [
    "GROUP_ALLREDUCE_ALGORITHMS",
    "GROUP_ALLREDUCE_CHOICES",
    "GroupAllreduceAlgorithm",
    "GroupAllreduceChoice",
    "GroupAllreduceSchedule",
    "butterfly_halving_doubling",
    "butterfly_recursive_doubling",
    "check_group_arguments",
    "choose_group_allreduce",
    "group_allreduce",
    "group_communicators",
    "group_schedule",
    "library_schedule",
]

#: Default tag of the blocking group allreduce on the data channel.  The
#: wait-avoiding collective passes tags that encode the version instead.
TAG_GROUP = 31

#: The butterfly schedules, the keys of :data:`GROUP_ALLREDUCE_ALGORITHMS`.
GroupAllreduceSchedule = Literal["recursive_doubling", "halving_doubling"]
#: The group allreduces that run, a butterfly or ``"mpi"``, the library's
#: ``MPI_Allreduce`` on the group's communicator (:data:`GROUP_ALLREDUCE_CHOICES`).
GroupAllreduceChoice = Literal[GroupAllreduceSchedule, "mpi"]
#: What ``group_allreduce(algorithm=...)`` accepts: a choice or ``"auto"``
#: (:func:`group_schedule`).
GroupAllreduceAlgorithm = Literal[GroupAllreduceChoice, "auto"]


def _fold_in(
    buf: FlatBuffer, comm: Communicator, plan: GroupPlan, tag: int, src: FlatBuffer | None
) -> FlatBuffer | None:
    """Before the phases: ``src`` where it still holds this rank's input to
    them, None where ``buf`` holds it.

    A host first receives its folded rank's whole buffer and adds its own
    input to it (out of place: received straight into ``buf``, ``src``
    added there).  Any other rank's input is ``src`` where given (not in
    ``buf`` yet), else ``buf``.
    """
    if plan.folded_from is None:
        return src
    if src is not None:
        comm.recv(buf.msg(0, buf.numel), plan.folded_from, tag)
        buf.add_(0, buf.numel, src)
    else:
        scratch = buf.scratch(buf.numel)
        comm.recv(scratch.msg(0, buf.numel), plan.folded_from, tag)
        buf.add_(0, buf.numel, scratch)
    return None


def _folded(buf: FlatBuffer, comm: Communicator, plan: GroupPlan, tag: int, src: FlatBuffer | None) -> bool:
    """A folded rank's whole part: send its contribution to its host, receive
    the group's result.  Whether this rank is folded (and so done)."""
    if plan.folded_into is None:
        return False
    comm.send((buf if src is None else src).msg(0, buf.numel), plan.folded_into, tag)
    comm.recv(buf.msg(0, buf.numel), plan.folded_into, tag)
    return True


def _fold_out(buf: FlatBuffer, comm: Communicator, plan: GroupPlan, tag: int) -> None:
    """A host sends the group's result to its folded rank."""
    if plan.folded_from is not None:
        comm.send(buf.msg(0, buf.numel), plan.folded_from, tag)


def butterfly_recursive_doubling(
    buf: FlatBuffer,
    comm: Communicator,
    plan: GroupPlan,
    scale: float | None = None,
    tag: int = TAG_GROUP,
    src: FlatBuffer | None = None,
) -> None:
    """Sum over this rank's group of ``plan`` into ``buf``, whole buffer per phase.

    One phase per mask (WAGMA Algorithm 1): exchange the whole buffer with
    ``rank ^ mask`` and add.  log2 S messages of the full size: the schedule
    for small buffers.  Partners compute a + b and b + a, bitwise equal.
    Where P is not a power of two a folded rank first sends its buffer to
    its host, which adds it to its own before the phases and sends it the
    result after them (two more messages of the full size on the host).
    The inputs are ``src`` when given (only read), else ``buf`` itself (in
    place).  Out of place, the first phase sends ``src``, receives the
    partner's buffer straight into ``buf`` and adds ``src`` to it: the
    memory traffic of the in-place phase (which receives into scratch), so
    out of place costs nothing extra.
    """
    if _folded(buf, comm, plan, tag, src):
        return
    pending = _fold_in(buf, comm, plan, tag, src)
    if not plan.masks:
        if pending is not None:
            buf.copy_(pending)
    else:
        scratch = None
        for mask in plan.masks:
            peer = comm.rank ^ mask
            if pending is not None:
                comm.exchange(pending.msg(0, buf.numel), peer, buf.msg(0, buf.numel), peer, tag)
                buf.add_(0, buf.numel, pending)
                pending = None
                continue
            if scratch is None:
                scratch = buf.scratch(buf.numel)
            comm.exchange(buf.msg(0, buf.numel), peer, scratch.msg(0, buf.numel), peer, tag)
            buf.add_(0, buf.numel, scratch)
    if scale is not None:
        buf.scale_(0, buf.numel, scale)
    _fold_out(buf, comm, plan, tag)


def butterfly_halving_doubling(
    buf: FlatBuffer,
    comm: Communicator,
    plan: GroupPlan,
    scale: float | None = None,
    tag: int = TAG_GROUP,
    src: FlatBuffer | None = None,
) -> None:
    """Sum over this rank's group of ``plan`` into ``buf``, halving then doubling.

    The group's phases in order halve the buffer (a rank keeps the half on
    its side of the phase's mask and adds its partner's copy of it), leaving
    1/S of the buffer reduced over the group on each member; the phases in
    reverse order double it back.  2 log2 S messages, 2 (S - 1)/S of the
    buffer sent: the schedule for large buffers.  Each element is reduced on
    one rank and copied, so group members agree bitwise.  A folded rank
    (P not a power of two) and its host exchange whole buffers before and
    after, as in :func:`butterfly_recursive_doubling`.  ``src`` as there:
    the first phase receives the partner's copy of the kept half straight
    into ``buf`` and adds ``src``'s to it; every element of ``buf`` is
    written by a reduction or a receive.
    """
    if _folded(buf, comm, plan, tag, src):
        return
    if not plan.masks:
        butterfly_recursive_doubling(buf, comm, plan, scale, tag, src)
        return
    pending = _fold_in(buf, comm, plan, tag, src)
    rank = comm.rank
    lo, hi = 0, buf.numel
    windows = []
    scratch = None
    for mask in plan.masks:
        windows.append((lo, hi))
        mid = lo + (hi - lo) // 2
        (slo, shi), (lo, hi) = ((lo, mid), (mid, hi)) if rank & mask else ((mid, hi), (lo, mid))
        if pending is not None:
            comm.exchange(pending.msg(slo, shi), rank ^ mask, buf.msg(lo, hi), rank ^ mask, tag)
            buf.add_(lo, hi, pending, at=lo)
            pending = None
            continue
        if scratch is None:
            scratch = buf.scratch(hi - lo)
        comm.exchange(buf.msg(slo, shi), rank ^ mask, scratch.msg(0, hi - lo), rank ^ mask, tag)
        buf.add_(lo, hi, scratch)
    if scale is not None:
        buf.scale_(lo, hi, scale)
    for mask, (wlo, whi) in zip(reversed(plan.masks), reversed(windows)):
        # The partner holds the other half of the window split in this phase.
        olo, ohi = (wlo, lo) if lo > wlo else (hi, whi)
        comm.exchange(buf.msg(lo, hi), rank ^ mask, buf.msg(olo, ohi), rank ^ mask, tag)
        lo, hi = wlo, whi
    _fold_out(buf, comm, plan, tag)


#: The group allreduce schedules, by the name ``group_allreduce(algorithm=...)`` takes.
GROUP_ALLREDUCE_ALGORITHMS: dict[GroupAllreduceSchedule, Callable[..., None]] = {
    "recursive_doubling": butterfly_recursive_doubling,
    "halving_doubling": butterfly_halving_doubling,
}


#: What ``algorithm=`` accepts besides ``"auto"``: the butterflies and ``"mpi"``.
GROUP_ALLREDUCE_CHOICES: tuple[GroupAllreduceChoice, ...] = (*GROUP_ALLREDUCE_ALGORITHMS, "mpi")


def choose_group_allreduce(nbytes: int) -> GroupAllreduceSchedule:
    """The schedule ``algorithm="auto"`` runs: recursive doubling below
    :data:`~collectives.schedules.blocking.SMALL_ALLREDUCE_BYTES`, else
    halving/doubling.  Never the library (``"mpi"``), whose order of
    additions is its own (:mod:`~collectives.wait_avoiding.group_library`)."""
    return "recursive_doubling" if nbytes < SMALL_ALLREDUCE_BYTES else "halving_doubling"


def library_schedule(
    groups: GroupCommunicators,
    buf: FlatBuffer,
    comm: Communicator,
    plan: GroupPlan,
    scale: float | None = None,
    tag: int = TAG_GROUP,
    src: FlatBuffer | None = None,
) -> None:
    """``algorithm="mpi"``: the library's ``MPI_Allreduce`` on the
    communicator of ``plan``'s group; the schedules' signature once
    ``groups`` is bound (``comm`` and ``tag`` unused).

    Always the blocking ``MPI_Allreduce``, whoever runs it: a version may
    run on one member's main thread and on another's progress thread, and
    MPI matches a blocking collective only with blocking ones (MPI-4.1,
    section 6.12: "nonblocking collective operations do not match with
    blocking collective operations"); mixing ``MPI_Iallreduce`` on progress
    threads with ``MPI_Allreduce`` on main threads hung a 4-rank run.  The
    nonblocking call everywhere would match, but MPICH runs it over
    point-to-point schedules that progress only when tested: at 4 ranks on
    2 cores it took 1.06 ms at 4 KiB where the blocking call took 0.07 ms
    and our butterfly 0.34 ms (``collectives.bench wagma``).  So the call
    waits as the library waits (MPICH spins, Open MPI yields on an
    oversubscribed node), not as ``comm`` would.  An execution blocks its
    thread either way, as a butterfly's does.
    """
    library_allreduce_flat(groups.communicator(plan.members), buf, scale, src)


def group_schedule(
    algorithm: GroupAllreduceAlgorithm, comm: Communicator, grouping: ButterflyGrouping, nbytes: int
) -> Callable[..., None]:
    """The schedule that ``algorithm`` names for buffers of ``nbytes``,
    ``schedule(buf, comm, plan, scale, tag, src)``.

    A butterfly named is itself, and ``"auto"`` is
    :func:`choose_group_allreduce`'s.  ``"mpi"`` runs on the groups'
    communicators, made the first time ``comm`` is asked for them with
    ``grouping`` (collective over ``comm`` then, and kept until it
    closes).  Its results are bitwise equal within a group where the
    library gives every member the same result, as MPICH's, Open MPI's and
    Intel MPI's did in the tests at 2, 4 and 8 ranks (the MPI standard
    advises it without requiring it).
    """
    if algorithm == "auto":
        return GROUP_ALLREDUCE_ALGORITHMS[choose_group_allreduce(nbytes)]
    if algorithm in GROUP_ALLREDUCE_ALGORITHMS:
        return GROUP_ALLREDUCE_ALGORITHMS[algorithm]
    return partial(library_schedule, group_communicators(comm, grouping))


def group_communicators(comm: Communicator, grouping: ButterflyGrouping) -> GroupCommunicators:
    """The communicators of ``grouping``'s groups, made the first time
    ``comm`` is asked for them (collective over ``comm`` then) and kept
    until it closes."""
    return comm.derived(("butterfly groups", grouping), lambda: GroupCommunicators(comm, grouping))


def check_group_arguments(
    name: str,
    data: BufferT,
    comm: Communicator,
    group_size: int,
    t: int,
    op: Op,
    algorithm: GroupAllreduceAlgorithm,
    dynamic_groups: bool,
    check: bool,
) -> tuple[ButterflyGrouping, GroupPlan]:
    """The grouping and this rank's plan of iteration ``t``, once the
    arguments of :func:`group_allreduce` passed its checks (agreed across
    ranks where ``check``: :func:`~collectives.agreement.check_arguments`,
    errors raised as ``name``'s on every rank)."""
    info = describe(data)
    problem, error = info.problem, info.error
    grouping = plan = None
    try:
        if not isinstance(dynamic_groups, bool):
            raise TypeError(f"dynamic_groups must be True or False, got {dynamic_groups!r}")
        grouping = ButterflyGrouping(comm.size, group_size, dynamic_groups)
        plan = grouping.plan(t, comm.rank)
    except (TypeError, ValueError) as exc:
        problem, error = problem or str(exc), error if problem else type(exc)
    problem = problem or reduction_problem(info, algorithm, (*GROUP_ALLREDUCE_CHOICES, "auto"), op)
    check_arguments(
        comm,
        name,
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
    assert grouping is not None and plan is not None  # else check_arguments raised
    return grouping, plan


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
    compressor: Compressor | None = None,
) -> BufferT:
    """Reduce ``data`` within this rank's butterfly group of iteration ``t``.

    The ``comm.size`` = P ranks form groups of ``group_size`` = S ranks (P / S
    groups of S for powers of two; for any P and S between S and 2S ranks
    each, :class:`~collectives.wait_avoiding.groups.ButterflyGrouping`, WAGMA
    Algorithm 1, which changes the groups with ``t``; with
    ``dynamic_groups=False`` iteration 0's groups at every ``t``).  On
    return every member of a group holds the sum (or mean, ``op="avg"``) of
    the group's inputs, bitwise equal within the group.  This is the
    blocking group allreduce; all ranks call it with the same ``t``.

    Args:
        data: contiguous numpy array or torch tensor, as for
            :func:`~collectives.schedules.blocking.allreduce`.
        comm: a :class:`~collectives.comm.Communicator` (any size P >= 1).
        group_size: S, an int with 1 <= S <= P.
        t: the iteration (>= 0) whose grouping is used.
        op: ``"sum"`` or ``"avg"`` (divides by the size of the group, S
            for powers of two).
        algorithm: ``"recursive_doubling"``, ``"halving_doubling"``,
            ``"mpi"`` (the library's ``MPI_Allreduce`` on the group's
            communicator; float32, float64, int32 and int64: faster for
            small buffers, in the library's order of additions) or
            ``"auto"`` (:func:`choose_group_allreduce`).  With ``"mpi"`` the
            first call with a grouping makes its groups' communicators
            (collective), which ``comm`` keeps.
        dynamic_groups: Algorithm 1's groups of iteration ``t`` (default);
            False: the groups of iteration 0 whatever ``t`` (the same
            hypercube dimensions at every iteration: WAGMA's ablation 2,
            section 5.2, "the groups are fixed").
        check: agree on the arguments across ranks first.
        compressor: a :class:`~collectives.compression.allreduce.Compressor` (a float32
            buffer's stream): the group's compressed allreduce on its
            communicator in place of ``algorithm``
            (:func:`~collectives.compression.allreduce.compressed_group_schedule`;
            every member gets the same floats).

    Raises:
        ValueError, TypeError: on every rank, before any data moves.
    """
    grouping, plan = check_group_arguments(
        "group_allreduce", data, comm, group_size, t, op, algorithm, dynamic_groups, check
    )
    schedule = (
        group_schedule(algorithm, comm, grouping, data.nbytes)
        if compressor is None
        else partial(compressed_group_schedule, group_communicators(comm, grouping), compressor)
    )
    with comm.open_buffer(data) as buf:
        schedule(buf, comm, plan, 1.0 / plan.size if op == "avg" else None)
    return data
