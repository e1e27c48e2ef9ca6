"""Sub-communicators for the MPI tests: run a case on the first k world ranks, or on blocks of odd size."""

import pytest
from mpi4py import MPI

from collectives import Communicator

__all__ = ["ODD_BLOCKS", "block_of", "first_ranks", "member"]

#: How the MPI stages of 4 and 8 ranks cut COMM_WORLD into consecutive
#: blocks of odd size, which run a case side by side (:func:`block_of`): 3
#: ranks (and one alone) on 4, 5 and 3 on 8.  A world that is not a power of
#: two (a run by hand on 3, 5, 6 or 7 ranks) is a case of its own: no entry.
ODD_BLOCKS = {4: (3, 1), 8: (5, 3)}


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


def block_of(sizes):
    """This rank's block of COMM_WORLD cut into consecutive blocks of
    ``sizes`` ranks, a raw ``MPI.Intracomm`` the caller frees (collective
    over COMM_WORLD).  Every block runs the case at once."""
    world = MPI.COMM_WORLD
    if sum(sizes) != world.size:
        raise ValueError(f"blocks of {sizes} ranks do not make a world of {world.size}")
    color, end = 0, sizes[0]
    while world.rank >= end:
        color += 1
        end += sizes[color]
    return world.Split(color, world.rank)


def member(comm):
    """``comm``, or skip the test on a rank outside the sub-communicator."""
    if comm is None:
        pytest.skip("this rank is outside the sub-communicator")
    return comm
