"""The MPI library's own ``MPI_Allreduce`` as one more allreduce schedule.

``allreduce(..., algorithm="mpi")`` hands the buffer to the library, in place
(``MPI_IN_PLACE``, ``MPI_SUM``), on the data channel of the
:class:`~collectives.comm.Communicator`; ``algorithm="auto"`` takes it where
the tuning table (:mod:`collectives.schedules.tuning`) measured the library faster than
our schedules. Unlike our schedules, which move raw bytes and reduce with
numpy or torch, the library needs an MPI datatype with a sum: float16 and
bfloat16 have none in MPI 3.1, so they stay with our schedules.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import numpy as np
from mpi4py import MPI

if TYPE_CHECKING:
    from ..buffers import Buffer, FlatBuffer
    from ..comm import Communicator

__all__ = [
    "LIBRARY_DTYPES",
    "bound_library_allreduce",
    "host_array",
    "library_allreduce",
    "library_allreduce_flat",
    "library_allreduce_array",
    "library_allreduce_in_place",
    "library_dtype_problem",
]

#: dtype name -> the MPI datatype the library reduces it as.
LIBRARY_DTYPES: dict[str, MPI.Datatype] = {
    "float32": MPI.FLOAT,
    "float64": MPI.DOUBLE,
    "int32": MPI.INT32_T,
    "int64": MPI.INT64_T,
}


def library_dtype_problem(dtype: str) -> str | None:
    """None if the library can sum ``dtype``, else a sentence saying it cannot."""
    if dtype in LIBRARY_DTYPES:
        return None
    return (
        f"algorithm 'mpi' (the library's MPI_Allreduce) needs a dtype MPI can sum, one of "
        f"{', '.join(LIBRARY_DTYPES)}; got {dtype}"
    )


def host_array(data: Buffer) -> np.ndarray | None:
    """``data`` as a numpy array sharing its memory (a CPU tensor's
    ``numpy()`` view), or None for a CUDA tensor."""
    if isinstance(data, np.ndarray):
        return data
    return None if data.is_cuda else data.detach().numpy()


def library_allreduce_array(data_comm: MPI.Intracomm, array: np.ndarray, scale: float | None = None) -> None:
    """``MPI_Allreduce(MPI_IN_PLACE, array, MPI_SUM)`` over ``data_comm`` on a
    numpy array (a host buffer's own memory), then ``scale``."""
    data_comm.Allreduce(MPI.IN_PLACE, array, MPI.SUM)
    if scale is not None:
        np.multiply(array, scale, out=array)


def bound_library_allreduce(data_comm: MPI.Intracomm, array: np.ndarray, scale: float | None) -> partial[None]:
    """:func:`library_allreduce_array` of ``array`` over ``data_comm``
    bound as a ``functools.partial``: without ``scale`` the library's
    ``MPI_Allreduce`` itself, so that a call adds no Python frame to it."""
    if scale is None:
        return partial(data_comm.Allreduce, MPI.IN_PLACE, array, MPI.SUM)
    return partial(library_allreduce_array, data_comm, array, scale)


def library_allreduce_flat(
    data_comm: MPI.Intracomm, buf: FlatBuffer, scale: float | None = None, src: FlatBuffer | None = None
) -> None:
    """``MPI_Allreduce`` (``MPI_SUM``) over ``data_comm`` into a
    :class:`~collectives.buffers.FlatBuffer` (CUDA tensors, staged or not),
    of ``src`` where given (out of place), else of ``buf`` itself
    (``MPI_IN_PLACE``); then ``scale`` on every rank alike."""
    datatype = LIBRARY_DTYPES[buf.dtype]
    send = MPI.IN_PLACE if src is None else [src.msg(0, buf.numel), buf.numel, datatype]
    data_comm.Allreduce(send, [buf.msg(0, buf.numel), buf.numel, datatype], MPI.SUM)
    if scale is not None:
        buf.scale_(0, buf.numel, scale)


def library_allreduce(buf: FlatBuffer, comm: Communicator, scale: float | None = None) -> None:
    """``MPI_Allreduce(MPI_IN_PLACE, buf, MPI_SUM)`` over ``comm.data``, then
    ``scale`` (averaging) on every rank alike: the schedule form of
    :func:`library_allreduce_flat`."""
    library_allreduce_flat(comm.data, buf, scale)


def library_allreduce_in_place(data: Buffer, comm: Communicator, scale: float | None = None) -> bool:
    """:func:`library_allreduce` on the caller's numpy array or CPU tensor
    itself, without the flat-buffer view: the library's call is what
    ``auto`` chose where it is fastest, mostly for small buffers, where a few
    microseconds of Python per call would show (on 2 ranks at 64 KiB the
    view cost 5 us of MPICH's 21). Returns False for a buffer it does not
    take (CUDA tensors), which then goes through :func:`library_allreduce`."""
    array = host_array(data)
    if array is None:
        return False
    library_allreduce_array(comm.data, array, scale)
    return True
