"""Sub-communicators for the MPI tests: run a case on the first k world ranks."""

import pytest
from mpi4py import MPI

from collectives import Communicator

__all__ = ["first_ranks", "member"]


def first_ranks(k):
    """Yield a Communicator over the first k world ranks (None on the others),
    and free it afterwards: the body of a module-scoped fixture."""
    world = MPI.COMM_WORLD
    raw = world.Split(0 if world.rank < k else MPI.UNDEFINED, world.rank)
    if raw == MPI.COMM_NULL:
        yield None
        return
    comm = Communicator(raw)
    yield comm
    comm.close()
    raw.Free()


def member(comm):
    """``comm``, or skip the test on a rank outside the sub-communicator."""
    if comm is None:
        pytest.skip("this rank is outside the sub-communicator")
    return comm
