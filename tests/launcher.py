"""What the serial tests that start jobs share: the ``mpiexec`` to use, and how far a run file got."""

import os
import shutil
import sys
from pathlib import Path

import h5py


def mpiexec():
    """``$MPIEXEC``, else the launcher next to this interpreter (the mpich
    wheel's), else the one on PATH, else None."""
    if os.environ.get("MPIEXEC"):
        return os.environ["MPIEXEC"]
    local = Path(sys.executable).parent / "mpiexec"
    if local.exists():
        return str(local)
    return shutil.which("mpiexec")


def steps_written(path):
    """Steps every rank has in the run file at ``path`` so far, or 0 while it
    does not exist or its writer has it open."""
    try:
        with h5py.File(path, "r", locking=False) as f:
            return int(f["steps"].attrs["written"])
    except (OSError, KeyError):
        return 0
