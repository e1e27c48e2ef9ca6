"""What the serial tests that start jobs share: the ``mpiexec`` to use, and how far a run file got."""

import sys

import h5py

# The launcher the experiments use, or None; and the command line that starts
# N ranks with it, with the flags its library needs.
from experiments.mpirun import find_mpiexec as mpiexec
from experiments.mpirun import mpiexec_command

__all__ = ["fault_tolerant_job", "mpiexec", "mpiexec_command", "steps_written"]


def fault_tolerant_job(ranks, *command):
    """The command line that runs ``command`` on ``ranks`` ranks as a user
    does under MPI fault tolerance: through ``experiments.mpirun
    --fault-tolerant``, which adds ULFM's flags and gives the job its secret."""
    return [sys.executable, "-m", "experiments.mpirun", "--fault-tolerant", "-n", str(ranks), "--", *command]


def steps_written(path):
    """Steps every rank has in the run file at ``path`` so far, or 0 while it
    does not exist or its writer has it open."""
    try:
        with h5py.File(path, "r", locking=False) as f:
            return int(f["steps"].attrs["written"])
    except (OSError, KeyError):
        return 0
