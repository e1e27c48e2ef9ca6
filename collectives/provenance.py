"""What a benchmark file records about the run that made it."""

from __future__ import annotations

import contextlib
import datetime
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Iterator, Mapping

import h5py
import mpi4py
import numpy as np
from mpi4py import MPI

from .mpi_library import mpi_library

__all__ = ["TUNING_PREFIXES", "results_file", "run_attributes", "tuning_environment"]


def _git_commit() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        out = subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() or "unknown"


#: Prefixes of environment variables that change how MPI, the allocator or
#: threads behave, recorded with every run: a measurement made with
#: ``MALLOC_MMAP_THRESHOLD_`` or an ``MPIR_CVAR_`` set is another measurement.
TUNING_PREFIXES = ("MALLOC_", "MPIR_CVAR_", "MPICH_", "OMPI_MCA_", "UCX_", "OMP_", "COLLECTIVES_")


def tuning_environment(environ: Mapping[str, str] = os.environ) -> str:
    """``NAME=value`` pairs, sorted and joined by ``;``, of the variables in
    ``environ`` whose names start with one of :data:`TUNING_PREFIXES`."""
    return ";".join(f"{name}={value}" for name, value in sorted(environ.items()) if name.startswith(TUNING_PREFIXES))


def run_attributes(comm: MPI.Comm) -> dict[str, object]:
    """Attributes for an HDF5 file: who ran what, where, with which MPI.

    Collective over ``comm`` (gathers the host names); every rank gets the
    same dictionary. ``command`` is rank 0's command line as Python was
    given it (``sys.orig_argv``: ``python -m mpi4py -m collectives.bench
    wagma ...``), so a file says which command made it; ``slurm_job_id`` is the Slurm job that ran it (empty
    outside Slurm), so a file in a sweep's folder names its job and log;
    ``tuning_environment`` is rank 0's :func:`tuning_environment` (``mpiexec
    -genv`` gives every rank the same).
    """
    hosts = sorted(set(comm.allgather(platform.node())))
    return {
        "ranks": comm.Get_size(),
        "command": comm.bcast(shlex.join(sys.orig_argv), root=0),
        "hostnames": ",".join(hosts),
        "cores_per_host": os.cpu_count() or 0,
        "mpi_library": mpi_library()[2],
        "mpi4py_version": mpi4py.__version__,
        "numpy_version": np.__version__,
        "python_version": platform.python_version(),
        "git_commit": _git_commit(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID", ""),
        "tuning_environment": comm.bcast(tuning_environment(), root=0),
        "start_time": datetime.datetime.now(datetime.timezone.utc).isoformat(),
    }


@contextlib.contextmanager
def results_file(out: str | None, default_name: str, attrs: Mapping[str, object]) -> Iterator[h5py.File]:
    """Write a benchmark's HDF5 file: ``out``, or ``results/default_name``.

    Creates the folder, opens the file for writing with ``attrs`` (from
    :func:`run_attributes`) as its attributes, yields it, and once it is
    closed prints where it went.
    """
    path = out or os.path.join("results", default_name)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with h5py.File(path, "w") as f:
        f.attrs.update(attrs)
        yield f
    print(f"wrote {path}")
