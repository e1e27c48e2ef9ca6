"""Tuning tables under mpiexec: every rank takes rank 0's table, and auto runs what it says."""

import json
import os
import tempfile

import numpy as np
import pytest
from mpi4py import MPI

from collectives import Communicator, allreduce
from collectives.mpi_library import mpi_library
from collectives.schedules.blocking import choose_allreduce
from collectives.schedules.tuning import TUNING_ENV, node_shape, table_name

pytestmark = pytest.mark.mpi
WORLD = MPI.COMM_WORLD
KIB, MIB = 1 << 10, 1 << 20


@pytest.fixture
def tuning_env():
    """Restore this rank's COLLECTIVES_TUNING after the test."""
    before = os.environ.get(TUNING_ENV)
    yield
    if before is None:
        os.environ.pop(TUNING_ENV, None)
    else:
        os.environ[TUNING_ENV] = before


def _record(winner_small, winner_large):
    library, version, _ = mpi_library()
    nodes, per_node = node_shape(WORLD)
    sizes = [4 * KIB, MIB]
    names = ["mpi", "ring", "rhd", "recursive_doubling"]
    seconds = {name: [1.0 if name != winner_small else 0.1, 1.0 if name != winner_large else 0.1] for name in names}
    return dict(
        library=library,
        version=version,
        ranks=WORLD.size,
        nodes=nodes,
        ranks_per_node=per_node,
        sizes_bytes=sizes,
        median_seconds=seconds,
    )


def test_every_rank_takes_rank_zeros_table_whatever_its_own_environment(tuning_env):
    # Rank 0 sees a folder with a table for this setting; the others see
    # tables switched off. All must decide as rank 0 does, or the schedules
    # they pick would not match.
    record = _record("ring", "mpi")
    folder = tempfile.mkdtemp(prefix="tuning-") if WORLD.rank == 0 else None
    if WORLD.rank == 0:
        with open(
            os.path.join(
                folder, table_name(**{k: record[k] for k in ("library", "version", "ranks", "nodes", "ranks_per_node")})
            ),
            "w",
        ) as f:
            json.dump(record, f)
    os.environ[TUNING_ENV] = folder if WORLD.rank == 0 else "off"
    with Communicator(WORLD) as comm:
        table = comm.tuning
        assert table is not None and table.seconds == record["median_seconds"]
        assert [choose_allreduce(n, comm.size, table, "float32") for n in (4 * KIB, MIB, 64 * MIB)] == [
            "ring",
            "mpi",
            "mpi",
        ]
        x = np.full(MIB // 4, comm.rank + 1, dtype=np.float32)
        allreduce(x, comm=comm)  # auto: the library's Allreduce, per the table
        assert np.all(x == comm.size * (comm.size + 1) / 2)
    WORLD.Barrier()
    if WORLD.rank == 0:
        for name in os.listdir(folder):
            os.remove(os.path.join(folder, name))
        os.rmdir(folder)


def test_an_unreadable_table_fails_on_every_rank(tuning_env):
    path = None
    if WORLD.rank == 0:
        fd, path = tempfile.mkstemp(suffix=".json")
        os.write(fd, b"{not json")
        os.close(fd)
    os.environ[TUNING_ENV] = path if WORLD.rank == 0 else "off"
    with Communicator(WORLD) as comm:
        with pytest.raises(ValueError, match="cannot read the tuning table"):
            allreduce(np.ones(4, dtype=np.float32), comm=comm)
        assert not comm.data.iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)
    if path:
        os.remove(path)


def test_node_shape_counts_this_machine_once():
    nodes, per_node = node_shape(WORLD)
    assert (nodes, per_node) == (1, WORLD.size)  # the tests run on one machine
