"""One ``mpiexec`` job per call, its command line printed as it can be pasted to run it again."""

import os
import shlex
import subprocess
import sys
import time

from .mpirun import mpiexec_command

__all__ = ["clear_run", "digits_mlp_args", "run_module", "run_training", "shown"]


def shown(path):
    """``path`` as a command line shows it: relative to the working directory when inside it."""
    relative = os.path.relpath(path)
    return relative if not relative.startswith(os.pardir) else path


def clear_run(out):
    """Remove an earlier run file ``out`` and its partial file, so that what is
    read back after the job is the job's own."""
    from wagma.results import partial_path  # here: the launching process need not load MPI

    for path in (out, partial_path(out)):
        if os.path.exists(path):
            os.remove(path)


def _launch(mpiexec, ranks, tail, what, fault_tolerant=False, may_fail=False):
    launch = mpiexec_command(ranks, mpiexec, fault_tolerant=fault_tolerant)
    command = [*launch, sys.executable, *tail]
    print(f"\n$ {shlex.join([shown(mpiexec), *launch[1:], shown(sys.executable), *tail])}", flush=True)
    start = time.monotonic()
    status = subprocess.run(command, check=not may_fail).returncode
    print(f"{what} on {ranks} ranks: {time.monotonic() - start:.0f} s, exit status {status}", flush=True)
    return status


def digits_mlp_args(epochs, compute_ms):
    """``experiments.train`` options of the fault campaigns' runs: the MLP on
    digits for ``epochs``, each step padded to ``compute_ms``, evaluated at
    the end only."""
    return [
        "--dataset",
        "digits",
        "--model",
        "mlp",
        "--epochs",
        str(epochs),
        "--compute-ms",
        str(compute_ms),
        "--eval-every",
        "0",
    ]


def run_training(mpiexec, ranks, algo, out, extra, fault_tolerant=False, may_fail=False):
    """``experiments.train --algo ALGO --out OUT EXTRA --no-progress`` on
    ``ranks`` ranks (no job started here is watched in a terminal); returns
    its exit status.  ``may_fail``: a job that ends with an error (a
    synchronous algorithm whose rank was killed) is reported, not raised."""
    return _launch(
        mpiexec,
        ranks,
        ["-m", "experiments.train", "--algo", algo, "--out", out, *extra, "--no-progress"],
        algo,
        fault_tolerant=fault_tolerant,
        may_fail=may_fail,
    )


def run_module(mpiexec, ranks, module, args):
    """``python -m mpi4py -m MODULE ARGS`` on ``ranks`` ranks (mpi4py turns an
    exception on one rank into an abort of all); raises if it fails."""
    return _launch(mpiexec, ranks, ["-m", "mpi4py", "-m", module, *args], module)
