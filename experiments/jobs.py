"""One ``mpiexec`` job per call, its command line printed as it can be pasted to run it again."""

import os
import shlex
import signal
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


def _kill_with_descendants(pid):
    """SIGKILL ``pid`` and every process descended from it: a launcher and
    its ranks (Open MPI's start in sessions of their own, out of the
    launcher's process group), as the process tree stands when called."""
    children = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry))
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(children.get(current, ()))
    for member in tree:
        try:
            os.kill(member, signal.SIGKILL)
        except ProcessLookupError:
            continue


def _launch(mpiexec, ranks, tail, what, fault_tolerant=False, may_fail=False, deadline_s=None):
    launch = mpiexec_command(ranks, mpiexec, fault_tolerant=fault_tolerant)
    command = [*launch, sys.executable, *tail]
    print(f"\n$ {shlex.join([shown(mpiexec), *launch[1:], shown(sys.executable), *tail])}", flush=True)
    start = time.monotonic()
    job = subprocess.Popen(command)
    try:
        status = job.wait(timeout=deadline_s)
    except subprocess.TimeoutExpired:
        _kill_with_descendants(job.pid)
        status = job.wait()
        print(f"{what} on {ranks} ranks: killed, still running after its deadline of {deadline_s:.0f} s", flush=True)
    except BaseException:
        _kill_with_descendants(job.pid)
        raise
    print(f"{what} on {ranks} ranks: {time.monotonic() - start:.0f} s, exit status {status}", flush=True)
    if status != 0 and not may_fail:
        raise subprocess.CalledProcessError(status, command)
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


def run_training(mpiexec, ranks, algo, out, extra, fault_tolerant=False, may_fail=False, deadline_s=None):
    """``experiments.train --algo ALGO --out OUT EXTRA --no-progress`` on
    ``ranks`` ranks (no job started here is watched in a terminal); returns
    its exit status.  ``may_fail``: a job that ends with an error (a
    synchronous algorithm whose rank was killed) is reported, not raised.
    ``deadline_s``: a job still running then is killed, with every rank
    (status -9), so that one hung job cannot stall a campaign; its run file
    is completed from the row logs (``complete_run``) and put under its
    final name, status ``failed: killed at its deadline``, with the steps
    its ranks had taken (a file that cannot be completed, a rank killed
    while it wrote, is left as it is, and said so)."""
    status = _launch(
        mpiexec,
        ranks,
        ["-m", "experiments.train", "--algo", algo, "--out", out, *extra, "--no-progress"],
        algo,
        fault_tolerant=fault_tolerant,
        may_fail=may_fail,
        deadline_s=deadline_s,
    )
    if deadline_s is not None and status == -signal.SIGKILL and not os.path.exists(out):
        from wagma.results import complete_run, partial_path

        if os.path.exists(partial_path(out)):
            try:
                os.replace(complete_run(out, "failed: killed at its deadline"), out)
            except (OSError, ValueError) as error:
                print(f"{algo}: the killed job's run file {partial_path(out)} was not completed: {error}", flush=True)
    return status


def run_module(mpiexec, ranks, module, args):
    """``python -m mpi4py -m MODULE ARGS`` on ``ranks`` ranks (mpi4py turns an
    exception on one rank into an abort of all); raises if it fails."""
    return _launch(mpiexec, ranks, ["-m", "mpi4py", "-m", module, *args], module)
