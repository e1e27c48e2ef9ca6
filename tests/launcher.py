"""What the serial tests that start jobs share: the ``mpiexec`` to use, and how far a run file got."""

import h5py

# The launcher the experiments use, or None; and the command line that starts
# N ranks with it, with the flags its library needs.
from experiments.mpirun import find_mpiexec as mpiexec
from experiments.mpirun import mpiexec_command

__all__ = ["mpiexec", "mpiexec_command", "steps_written"]


def steps_written(path):
    """Steps every rank has in the run file at ``path`` so far, or 0 while it
    does not exist or its writer has it open."""
    try:
        with h5py.File(path, "r", locking=False) as f:
            return int(f["steps"].attrs["written"])
    except (OSError, KeyError):
        return 0
