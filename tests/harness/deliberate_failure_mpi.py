"""An MPI test that fails on purpose: rank 1 raises while the others block.

Not collected by default (``collect_ignore`` in ``tests/conftest.py``, and the
file name lacks the ``test_`` prefix); ``tests/test_harness.py`` runs it under
``scripts/mpi-pytest`` to show that a failure on one rank ends the whole job
instead of leaving the other ranks waiting forever.
"""

import time

import pytest

FAILURE_TEXT = "deliberate failure on rank 1"


@pytest.mark.mpi(min_size=2)
def test_rank1_fails_while_others_wait():
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    if comm.rank == 1:
        # The time lets the caller measure how long the job takes to end.
        raise AssertionError(f"{FAILURE_TEXT} at unix time {time.time():.3f}")
    # Rank 1 never joins: without fail-fast this blocks forever.
    comm.Barrier()
