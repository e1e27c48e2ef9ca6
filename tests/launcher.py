"""What the serial tests that start jobs share: the ``mpiexec`` to use, and how far a run file got."""

import h5py

# The launcher the experiments use, or None.
from experiments.campaign import find_mpiexec as mpiexec

__all__ = ["mpiexec", "steps_written"]


def steps_written(path):
    """Steps every rank has in the run file at ``path`` so far, or 0 while it
    does not exist or its writer has it open."""
    try:
        with h5py.File(path, "r", locking=False) as f:
            return int(f["steps"].attrs["written"])
    except (OSError, KeyError):
        return 0
