"""What a benchmark file records about the run that made it."""

import datetime
import os
import platform
import subprocess

import mpi4py
import numpy as np
from mpi4py import MPI

__all__ = ["run_attributes"]


def _git_commit() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        out = subprocess.run(["git", "-C", here, "rev-parse", "HEAD"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() or "unknown"


def run_attributes(comm) -> dict:
    """Attributes for an HDF5 file: who ran what, where, with which MPI.

    Collective over ``comm`` (gathers the host names); every rank gets the
    same dictionary.
    """
    hosts = sorted(set(comm.allgather(platform.node())))
    return {
        "ranks": comm.Get_size(),
        "hostnames": ",".join(hosts),
        "cores_per_host": os.cpu_count() or 0,
        "mpi_library": MPI.Get_library_version().strip().splitlines()[0],
        "mpi4py_version": mpi4py.__version__,
        "numpy_version": np.__version__,
        "python_version": platform.python_version(),
        "git_commit": _git_commit(),
        "start_time": datetime.datetime.now(datetime.timezone.utc).isoformat(),
    }
