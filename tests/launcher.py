"""The ``mpiexec`` the serial tests start jobs with."""

import os
import shutil
import sys
from pathlib import Path


def mpiexec():
    """``$MPIEXEC``, else the launcher next to this interpreter (the mpich
    wheel's), else the one on PATH, else None."""
    if os.environ.get("MPIEXEC"):
        return os.environ["MPIEXEC"]
    local = Path(sys.executable).parent / "mpiexec"
    if local.exists():
        return str(local)
    return shutil.which("mpiexec")
