"""Whether the MPI library can read and write CUDA device memory directly."""

import ctypes
import functools
import os

__all__ = ["ENV_CUDA_AWARE", "mpi_is_cuda_aware"]

#: Environment variable that overrides the library query, ``1`` (device
#: pointers go to MPI) or ``0`` (device buffers are staged through pinned host
#: memory).  Sites whose MPI is CUDA-aware but does not export
#: ``MPIX_Query_cuda_support`` set it to ``1``.
ENV_CUDA_AWARE = "COLLECTIVES_CUDA_AWARE"


@functools.cache
def mpi_is_cuda_aware() -> bool:
    """Return True when device pointers may be passed to MPI.

    Order of precedence: the ``COLLECTIVES_CUDA_AWARE`` environment variable
    (``0``/``1``); then ``MPIX_Query_cuda_support()`` (MPICH >= 4, Open MPI
    >= 4 export it) looked up through ctypes in the MPI library that mpi4py
    is linked against; otherwise False, the safe answer: staging through
    host memory works with every MPI.
    """
    override = os.environ.get(ENV_CUDA_AWARE)
    if override is not None:
        if override not in ("0", "1"):
            raise ValueError(f"{ENV_CUDA_AWARE} must be '0' or '1', got {override!r}")
        return override == "1"
    from mpi4py import MPI

    try:
        # dlsym on the extension module's handle also searches the libraries
        # it depends on, among them libmpi.
        query = ctypes.CDLL(MPI.__file__).MPIX_Query_cuda_support
    except (OSError, AttributeError):
        return False
    query.restype = ctypes.c_int
    query.argtypes = []
    return bool(query())
