"""Shared pytest configuration for the test suite."""

import json
import os
import shutil
import tempfile

import pytest

# tests/harness holds tests that fail on purpose (they check the MPI test
# runner's fail-fast); they run only when named on the command line.
collect_ignore = ["harness"]


def pytest_collection_modifyitems(config, items):
    """An MPI test (marked ``mpi``) lives in a file whose name ends in
    ``_mpi.py``: the MPI stages collect only those (the Makefile's
    ``MPI_TESTS``), so one elsewhere would never run there."""
    misplaced = sorted(
        {
            item.nodeid.split("::")[0]
            for item in items
            if item.get_closest_marker("mpi") and not item.path.name.endswith("_mpi.py")
        }
    )
    if misplaced:
        raise pytest.UsageError(
            "MPI tests belong in files ending in _mpi.py (the MPI stages collect only those): " + ", ".join(misplaced)
        )


@pytest.fixture(autouse=True)
def _logging_as_it_was():
    """A test that runs an entry point's main() in this process (which calls
    collectives.logs.configure_logging) leaves the logging set-up as it found
    it: no handler on a stream pytest has closed since, no level changed."""
    import logging

    from collectives.logs import PACKAGES

    loggers = [logging.getLogger(), *(logging.getLogger(name) for name in PACKAGES)]
    saved = [(logger, logger.handlers[:], logger.level) for logger in loggers]
    yield
    for logger, handlers, level in saved:
        logger.handlers[:] = handlers
        logger.setLevel(level)


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


@pytest.fixture
def record_measurement(request):
    """``record(name, value, bound, above=False)``: what a randomized or
    timing-dependent test measured and the bound it checks ``value``
    against (``value < bound``; with ``above``, ``value >= bound``),
    appended as a JSON line to ``$WAGMA_TEST_MEASUREMENTS`` by rank 0 of
    COMM_WORLD when that is set (scripts/repeat-mpi-tests sets it and
    tabulates the distribution: results/failure-rates); else nothing."""
    path = os.environ.get("WAGMA_TEST_MEASUREMENTS")

    def record(name, value, bound, above=False):
        from mpi4py import MPI

        if path and MPI.COMM_WORLD.rank == 0:
            with open(path, "a") as out:
                out.write(
                    json.dumps(
                        {
                            "test": request.node.nodeid,
                            "name": name,
                            "ranks": MPI.COMM_WORLD.size,
                            "value": float(value),
                            "bound": float(bound),
                            "above": bool(above),
                        }
                    )
                    + "\n"
                )

    return record
