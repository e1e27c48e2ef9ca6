"""What a results file records about the run that made it, on every rank alike."""

import os
import shlex
import sys
import tempfile

import h5py
import pytest
from mpi4py import MPI

from collectives.mpi_library import mpi_library
from collectives.provenance import run_attributes


@pytest.mark.mpi(min_size=2)
def test_run_attributes_round_trip_through_hdf5():
    """Every rank gets the same attributes, and h5py stores and returns them
    unchanged (an embedded NUL raised ``ValueError: VLEN strings do not
    support embedded NULLs`` under Open MPI)."""
    comm = MPI.COMM_WORLD
    attrs = run_attributes(comm)
    assert (
        comm.allgather(sorted((k, str(v)) for k, v in attrs.items() if k != "start_time"))
        == [sorted((k, str(v)) for k, v in attrs.items() if k != "start_time")] * comm.size
    )
    assert attrs["ranks"] == comm.size and attrs["mpi_library"] == mpi_library()[2]
    # The command that made the file, as rank 0's Python was given it (here: python -m mpi4py ...).
    assert shlex.split(attrs["command"]) == comm.bcast(sys.orig_argv) and "mpi4py" in attrs["command"]
    with tempfile.TemporaryDirectory(prefix=f"provenance-{comm.rank}-") as folder:
        path = os.path.join(folder, "attrs.h5")
        with h5py.File(path, "w") as f:
            f.attrs.update(attrs)
        with h5py.File(path, "r") as f:
            back = dict(f.attrs)
    assert {k: (v.item() if hasattr(v, "item") else v) for k, v in back.items()} == attrs
