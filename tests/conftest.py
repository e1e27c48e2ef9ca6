"""Shared pytest configuration for the test suite."""

import shutil
import tempfile

import pytest

# tests/harness holds tests that fail on purpose (they check the MPI test
# runner's fail-fast); they run only when named on the command line.
collect_ignore = ["harness"]


@pytest.fixture
def shared_dir():
    """For MPI tests: a folder every rank of COMM_WORLD sees, removed by rank 0
    once every rank is done with it."""
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    path = world.bcast(tempfile.mkdtemp(prefix="wagma-train-") if world.rank == 0 else None)
    yield path
    world.Barrier()
    if world.rank == 0:
        shutil.rmtree(path)
