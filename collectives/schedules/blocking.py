"""Blocking Allreduce, ReduceScatter and Allgather over our point-to-point schedules."""

from __future__ import annotations

from collections.abc import Callable, Collection
from functools import partial
from typing import TYPE_CHECKING, Literal, cast, get_args

from ..agreement import check_arguments
from ..buffers import Buffer, BufferInfo, BufferT, describe
from .halving_doubling import (
    recursive_doubling_allgather,
    recursive_doubling_allreduce,
    recursive_halving_reduce_scatter,
    rhd_allreduce,
)
from .library import (
    bound_library_allreduce,
    host_array,
    library_allreduce,
    library_allreduce_in_place,
    library_dtype_problem,
)
from .partition import block_offsets
from .ring import ring_allgather, ring_allreduce, ring_reduce_scatter

if TYPE_CHECKING:
    from ..comm import Communicator
    from .tuning import TuningTable

__all__ = [
    "ALLGATHER_ALGORITHMS",
    "ALLREDUCE_ALGORITHMS",
    "ALLREDUCE_CHOICES",
    "AllgatherAlgorithm",
    "AllreduceAlgorithm",
    "AllreduceChoice",
    "AllreduceSchedule",
    "LIBRARY_MARGIN",
    "OPS",
    "Op",
    "PersistentAllreduce",
    "REDUCE_SCATTER_ALGORITHMS",
    "ReduceScatterAlgorithm",
    "SMALL_ALLREDUCE_BYTES",
    "allgather",
    "allreduce",
    "allreduce_init",
    "broadcast",
    "choice_problem",
    "choose_allreduce",
    "reduce_scatter",
    "reduction_problem",
]

#: Reduction operations, ``sum`` or ``avg`` (the sum divided by the number
#: of contributions, floating-point buffers only).
Op = Literal["sum", "avg"]
#: The reduction operations, the values of :data:`Op`.
OPS: tuple[Op, ...] = get_args(Op)

#: Our allreduce schedules, the keys of :data:`ALLREDUCE_ALGORITHMS`.
AllreduceSchedule = Literal["ring", "rhd", "recursive_doubling"]
#: What ``allreduce(algorithm=...)`` runs, ours or ``"mpi"`` (the keys of :data:`ALLREDUCE_CHOICES`).
AllreduceChoice = Literal[AllreduceSchedule, "mpi"]
#: What ``allreduce(algorithm=...)`` accepts, a choice or ``"auto"`` (:func:`choose_allreduce`).
AllreduceAlgorithm = Literal[AllreduceChoice, "auto"]
#: What ``reduce_scatter(algorithm=...)`` accepts, the keys of :data:`REDUCE_SCATTER_ALGORITHMS`.
ReduceScatterAlgorithm = Literal["ring", "recursive_halving"]
#: What ``allgather(algorithm=...)`` accepts, the keys of :data:`ALLGATHER_ALGORITHMS`.
AllgatherAlgorithm = Literal["ring", "recursive_doubling"]

#: Our allreduce schedules, by the name ``allreduce(algorithm=...)`` takes.
ALLREDUCE_ALGORITHMS: dict[AllreduceSchedule, Callable[..., None]] = {
    "ring": ring_allreduce,
    "rhd": rhd_allreduce,
    "recursive_doubling": recursive_doubling_allreduce,
}
#: What ``allreduce(algorithm=...)`` accepts besides ``"auto"``, our
#: schedules and ``"mpi"``, the library's own ``MPI_Allreduce``
#: (:func:`~collectives.schedules.library.library_allreduce`; float32, float64, int32 and int64 only).
ALLREDUCE_CHOICES: dict[AllreduceChoice, Callable[..., None]] = dict(ALLREDUCE_ALGORITHMS.items())
ALLREDUCE_CHOICES["mpi"] = library_allreduce
# What auto may pick from a tuning table: all, or ours alone for a dtype the library cannot sum.
_AUTO_WITH_LIBRARY, _AUTO_OURS = tuple(ALLREDUCE_CHOICES), tuple(ALLREDUCE_ALGORITHMS)
#: The reduce-scatter schedules, by the name ``reduce_scatter(algorithm=...)`` takes.
REDUCE_SCATTER_ALGORITHMS: dict[ReduceScatterAlgorithm, Callable[..., None]] = {
    "ring": ring_reduce_scatter,
    "recursive_halving": recursive_halving_reduce_scatter,
}
#: The allgather schedules, by the name ``allgather(algorithm=...)`` takes.
ALLGATHER_ALGORITHMS: dict[AllgatherAlgorithm, Callable[..., None]] = {
    "ring": ring_allgather,
    "recursive_doubling": recursive_doubling_allgather,
}

#: Below this many bytes ``algorithm="auto"`` takes recursive doubling (few
#: messages); from it on a bandwidth-optimal schedule, where no tuning table
#: applies and the library may not run.  On 4 ranks of this project's 2-core
#: reference machine recursive doubling was the fastest of ours from 4 KiB to
#: 1 MiB (docs/benchmarks.md, "Allreduce benchmark").
SMALL_ALLREDUCE_BYTES = 1 << 20
#: How much faster than the library's ``MPI_Allreduce`` a tuning table must
#: have measured one of ours for ``auto`` to take it.  Near a crossover the
#: two are within the run-to-run noise, where a wrong pick of ours costs what
#: the library would not: ties go to the library.  On the 2-core reference
#: machine the sizes where a table had measured ours 1.10x to 1.25x ahead
#: came out between 0.76x and 1.13x of the library in the next run (eight
#: cells, three libraries; docs/mpi.md), no gain on average.  Larger leads
#: held, but for 4 MiB on 2 ranks, where both libraries' times swing by 2x
#: between runs.
LIBRARY_MARGIN = 1.3


def choose_allreduce(
    nbytes: int, size: int, tuning: TuningTable | None = None, dtype: str = "float32", library: bool = True
) -> AllreduceChoice:
    """The schedule ``algorithm="auto"`` runs for ``nbytes`` of ``dtype`` on ``size`` ranks.

    With a tuning table (:mod:`.tuning`, measured for this library, rank
    count and node shape), the fastest entry it measured at the nearest size,
    the library's ``MPI_Allreduce`` (``"mpi"``) included where the dtype
    allows it, and kept unless one of ours was :data:`LIBRARY_MARGIN` times
    faster.  Without one, the library's ``MPI_Allreduce`` wherever it may
    run: a library, rank count or node shape that no table knows is one
    nobody measured, and the library's own selection, tuned by its authors
    for its transports, is the choice that is never behind the library.
    Where the library may not run (a dtype MPI cannot sum, or ``library``
    False), fixed thresholds between ours: recursive doubling below
    :data:`SMALL_ALLREDUCE_BYTES`.  Above it both
    ring and RHD send 2(p - 1)/p of the buffer; RHD does it in 2 log2 p
    messages instead of 2(p - 1), which decides at scale (at 1024 ranks and
    5 us per message the ring pays 10 ms of latency), so it is taken for
    powers of two, and the ring otherwise (RHD's fold for other p sends the
    whole buffer twice more).

    ``library`` False leaves the library out, as under MPI fault tolerance:
    the library frees its own sends as they complete, which a revoked
    communicator turns into the end of the job
    (:meth:`~collectives.comm.Communicator.isend` says how; this package's
    schedules keep theirs).
    """
    with_library = library and not library_dtype_problem(dtype)
    if tuning is not None:
        if with_library:
            measured = tuning.fastest(nbytes, _AUTO_WITH_LIBRARY, prefer="mpi", margin=LIBRARY_MARGIN)
        else:
            measured = tuning.fastest(nbytes, _AUTO_OURS)
        if measured:
            return cast(AllreduceChoice, measured)  # one of allowed
    if with_library:
        return "mpi"
    if nbytes < SMALL_ALLREDUCE_BYTES:
        return "recursive_doubling"
    return "rhd" if size & (size - 1) == 0 else "ring"


def choice_problem(name: str, value: object, choices: Collection[object]) -> str | None:
    """None if ``value`` is one of ``choices``, else a sentence naming both."""
    if value in choices:
        return None
    return f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}"


def reduction_problem(info: BufferInfo, algorithm: object, algorithms: Collection[str], op: object) -> str | None:
    """The first problem with a reduction's arguments, or None.

    ``info`` comes from :func:`~collectives.buffers.describe`; ``algorithm``
    must be a key of ``algorithms`` and ``op`` one of :data:`OPS`.
    """
    return (
        info.problem
        or choice_problem("algorithm", algorithm, tuple(algorithms))
        or choice_problem("op", op, OPS)
        or (algorithm == "mpi" and library_dtype_problem(info.dtype))
        or (
            op == "avg" and info.dtype.startswith("int") and f"op 'avg' needs a floating-point buffer, got {info.dtype}"
        )
        or None
    )


def _prepare(collective, data, comm, algorithm, algorithms, op, check):
    """Check the arguments (on every rank together).

    Returns the name of the schedule to run (``auto`` resolved) and the
    element count of ``data``.
    """
    info = describe(data)
    if algorithm == "auto" and collective == "allreduce":
        tuning = comm.tuning  # collective the first time: before any rank can stop on a problem
        if not info.problem:
            algorithm = choose_allreduce(data.nbytes, comm.size, tuning, info.dtype, not comm.fault_tolerant)
    problem = reduction_problem(info, algorithm, algorithms, op)
    check_arguments(
        comm, collective, problem, info.error, check, numel=info.numel, dtype=info.dtype, algorithm=algorithm, op=op
    )
    return algorithm, info.numel


def _run(schedule, data, comm, *args):
    with comm.open_buffer(data) as buf:
        schedule(buf, comm, *args)


def _scale(op, comm):
    return 1.0 / comm.size if op == "avg" else None


def allreduce(
    data: BufferT, *, comm: Communicator, algorithm: AllreduceAlgorithm = "auto", op: Op = "sum", check: bool = True
) -> BufferT:
    """Reduce ``data`` over all ranks of ``comm``, in place.

    On return every rank's ``data`` holds the element-wise sum (``op="sum"``)
    or mean (``op="avg"``) of all ranks' inputs, bitwise equal on all ranks.

    Args:
        data: a contiguous numpy array or torch tensor (CPU or CUDA) of a
            dtype in :data:`~collectives.buffers.SUPPORTED_DTYPES`; same
            element count and dtype on every rank.
        comm: a :class:`~collectives.comm.Communicator`.
        algorithm: ``"ring"``, ``"rhd"`` (recursive halving/doubling,
            Rabenseifner), ``"recursive_doubling"``, ``"mpi"`` (the MPI
            library's ``MPI_Allreduce``) or ``"auto"`` (:func:`choose_allreduce`:
            the tuning table's fastest, else the library where it may run).
        op: ``"sum"`` or ``"avg"``.
        check: agree on the arguments across ranks first (one small
            allgather on the control channel).  With False a bad argument
            raises on the ranks that passed it only: use it only where every
            rank is known to pass the same arguments.

    Returns:
        ``data``.

    Raises:
        ValueError, TypeError: on every rank, before any data moves, when
            any rank's arguments are bad or they differ across ranks.
    """
    chosen, _ = _prepare("allreduce", data, comm, algorithm, ALLREDUCE_CHOICES, op, check)
    if chosen == "mpi" and library_allreduce_in_place(data, comm, _scale(op, comm)):
        return data
    _run(ALLREDUCE_CHOICES[chosen], data, comm, _scale(op, comm))
    return data


class PersistentAllreduce(partial[None]):
    """:func:`allreduce` bound to one buffer, its arguments checked once.

    What MPI-4's ``MPI_Allreduce_init`` is to ``MPI_Allreduce``, and what
    DDP's buckets are to ``all_reduce`` (their shapes are verified across
    processes once, when the model is wrapped): construction, collective
    over ``comm``, checks the arguments on every rank together and resolves
    ``algorithm="auto"`` once; each call then reduces the bound buffer with
    neither.  Where the choice is the library's ``MPI_Allreduce`` and the
    buffer a numpy array or CPU tensor, a call is that ``MPI_Allreduce`` on
    it (and the scaling of ``op="avg"``) and nothing else: the object is a
    ``functools.partial`` of the library's call, so calling it adds no
    Python frame (docs/mpi.md, "``auto`` side by side with the library").

    A call returns None; the result is in the bound buffer, :attr:`data`.
    The buffer is bound: write each call's input into it (``data[:] = x``,
    ``tensor.copy_(x)``); a tensor resized or re-pointed after construction
    (``resize_``, ``set_``) is not seen.  Every rank must call its persistent
    allreduces in the same order, as MPI requires of collectives: that is
    the one rule not checked, since checking it would cost the round trip
    the binding saves.

    Example::

        grads = torch.zeros(n)
        reduce = allreduce_init(grads, comm=comm, op="avg")
        for step in range(steps):
            ...  # fill grads
            reduce()

    Args:
        data, comm, algorithm, op: as for :func:`allreduce`.

    Raises:
        ValueError, TypeError: on every rank, when any rank's arguments are
            bad or they differ across ranks (what :func:`allreduce` raises).
    """

    #: The bound buffer.
    data: Buffer
    comm: Communicator
    op: Op
    #: The schedule each call runs (``auto`` resolved), a key of :data:`ALLREDUCE_CHOICES`.
    algorithm: AllreduceChoice

    def __new__(
        cls, data: Buffer, *, comm: Communicator, algorithm: AllreduceAlgorithm = "auto", op: Op = "sum"
    ) -> PersistentAllreduce:
        chosen, _ = _prepare("allreduce", data, comm, algorithm, ALLREDUCE_CHOICES, op, True)
        scale = _scale(op, comm)
        array = host_array(data) if chosen == "mpi" else None
        if array is None:
            self = super().__new__(cls, _run, ALLREDUCE_CHOICES[chosen], data, comm, scale)
        else:
            bound = bound_library_allreduce(comm.data, array, scale)
            self = super().__new__(cls, bound.func, *bound.args)
        self.data, self.comm, self.op, self.algorithm = data, comm, op, chosen
        return self

    def __repr__(self) -> str:
        return f"PersistentAllreduce(algorithm={self.algorithm!r}, op={self.op!r}, ranks={self.comm.size})"


def allreduce_init(
    data: Buffer, *, comm: Communicator, algorithm: AllreduceAlgorithm = "auto", op: Op = "sum"
) -> PersistentAllreduce:
    """A :class:`PersistentAllreduce` of ``data``: collective, checks once."""
    return PersistentAllreduce(data, comm=comm, algorithm=algorithm, op=op)


def reduce_scatter(
    data: Buffer,
    *,
    comm: Communicator,
    algorithm: ReduceScatterAlgorithm = "ring",
    op: Op = "sum",
    check: bool = True,
) -> tuple[int, int]:
    """Leave block ``comm.rank`` of ``data`` reduced over all ranks, in place.

    ``data`` is cut into ``comm.size`` blocks by
    :func:`~collectives.schedules.partition.block_offsets`; on return block ``rank``
    holds the sum (or mean) of block ``rank`` of every rank's input.  Other
    blocks hold unspecified partial sums.

    Args:
        algorithm: ``"ring"`` or ``"recursive_halving"``.
        data, comm, op, check: as for :func:`allreduce`.

    Returns:
        ``(lo, hi)``: the element range of this rank's block.
    """
    chosen, numel = _prepare("reduce_scatter", data, comm, algorithm, REDUCE_SCATTER_ALGORITHMS, op, check)
    _run(REDUCE_SCATTER_ALGORITHMS[chosen], data, comm, _scale(op, comm))
    off = block_offsets(numel, comm.size)
    return off[comm.rank], off[comm.rank + 1]


def allgather(
    data: BufferT, *, comm: Communicator, algorithm: AllgatherAlgorithm = "ring", check: bool = True
) -> BufferT:
    """Copy block ``comm.rank`` of ``data`` to every rank, in place.

    On entry block ``r`` of rank ``r``'s ``data`` (blocks as in
    :func:`reduce_scatter`) holds its contribution; on return every rank
    holds all blocks.

    Args:
        algorithm: ``"ring"`` or ``"recursive_doubling"``.
        data, comm, check: as for :func:`allreduce`.

    Returns:
        ``data``.
    """
    chosen, _ = _prepare("allgather", data, comm, algorithm, ALLGATHER_ALGORITHMS, "sum", check)
    _run(ALLGATHER_ALGORITHMS[chosen], data, comm)
    return data


def broadcast(data: BufferT, *, comm: Communicator, root: int = 0, check: bool = True) -> BufferT:
    """Copy ``data`` of rank ``root`` to every rank, in place (``MPI_Bcast``).

    Args:
        data, comm, check: as for :func:`allreduce`.
        root: the rank whose data everyone gets.
    """
    info = describe(data)
    problem = info.problem or (
        None
        if isinstance(root, int) and 0 <= root < comm.size
        else f"root must be a rank in range({comm.size}), got {root!r}"
    )
    check_arguments(comm, "broadcast", problem, info.error, check, numel=info.numel, dtype=info.dtype, root=root)
    with comm.open_buffer(data) as buf:
        comm.data.Bcast(buf.msg(0, buf.numel), root)
    return data
