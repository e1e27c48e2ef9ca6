"""A job one of whose ranks is killed with SIGKILL mid-run; the survivors go on (ULFM).

Run by tests/test_fault_tolerance.py as
``experiments.mpirun --fault-tolerant -n P -- python killed_rank.py OUT_DIR VICTIM KILL_AT STEPS``.
Every rank allreduces a vector of ones STEPS times on a duplicate of
COMM_WORLD that returns errors. At step KILL_AT rank VICTIM kills itself. A
survivor whose allreduce fails revokes the communicator (so that every
survivor's pending collective fails too), shrinks it to the survivors, and
repeats the step there. Each survivor writes OUT_DIR/rank-R.json: the error
classes it saw, the seconds from the kill to its error, the sizes of the
communicators it used and the sums it got.
"""

import json
import os
import signal
import sys
import time

import numpy as np
from mpi4py import MPI

out_dir, victim, kill_at, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
world = MPI.COMM_WORLD
comm = world.Dup()
comm.Set_errhandler(MPI.ERRORS_RETURN)
report = {"rank": world.rank, "errors": [], "sizes": [], "sums": [], "detected_after_s": None}
kill_time = os.path.join(out_dir, "killed-at")
step = 0
while step < steps:
    if step == kill_at and world.rank == victim:
        with open(kill_time, "w") as f:
            f.write(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    ones = np.ones(1024)
    try:
        comm.Allreduce(MPI.IN_PLACE, ones, MPI.SUM)
    except MPI.Exception as error:
        report["errors"].append(error.Get_error_class())
        if report["detected_after_s"] is None and os.path.exists(kill_time):
            report["detected_after_s"] = time.time() - float(open(kill_time).read())
        comm.Revoke()
        survivors = comm.Shrink()
        comm.Free()
        comm = survivors
        comm.Set_errhandler(MPI.ERRORS_RETURN)
        continue  # the step again, on the survivors
    report["sizes"].append(comm.Get_size())
    report["sums"].append(float(ones[0]))
    step += 1
report["error_classes"] = {"ERR_PROC_FAILED": MPI.ERR_PROC_FAILED, "ERR_REVOKED": MPI.ERR_REVOKED}
with open(os.path.join(out_dir, f"rank-{world.rank}.json"), "w") as f:
    json.dump(report, f)
