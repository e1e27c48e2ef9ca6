"""A job whose rank 0, the run file's writer, is killed with SIGKILL mid-run; the survivors write the file (ULFM).

Run by tests/test_fault_tolerance.py as
``experiments.mpirun --fault-tolerant -n P -- python killed_writer.py OUT KILL_AT STEPS``.
Every rank records STEPS steps into a RunRecorder built on COMM_WORLD (row
values: 1000 * rank + step) and allreduces a flag at each step on a
duplicate of COMM_WORLD that returns errors; the root never flushes on its
own (flush_seconds of an hour), so every row lives in the logs only. Before
the first step rank 0 writes table ``t`` (one row) and every rank records an
evaluation. At step KILL_AT rank 0 kills itself. A survivor whose allreduce
fails revokes the communicator, shrinks it, hands it to the recorder's
rebuild() (its new rank 0 becomes the writer), records the membership change
with values the survivors agree on, repeats the step, and at the end the new
root hands table ``t`` as the rebuilt algorithm would (one new row) and all
close the file.
"""

import os
import signal
import sys
import time

import numpy as np
from mpi4py import MPI

from wagma.results import STEP_FIELDS, RunRecorder

out, kill_at, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
world = MPI.COMM_WORLD
recorder = RunRecorder(world, out, {"algorithm": "killed_writer", "batch_size": 1}, flush_seconds=3600.0)
comm = world.Dup()
comm.Set_errhandler(MPI.ERRORS_RETURN)
started = time.monotonic()
recorder.record_tables({"t": (np.array([[0.0, 1.0]]), ["a", "b"])})
recorder.flush()
recorder.record_eval(step=0, epoch=0.0, clock=0.0, accuracy=0.25, loss=2.0)
step = 0
while step < steps:
    if step == kill_at and world.rank == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    flag = np.ones(1)
    try:
        comm.Allreduce(MPI.IN_PLACE, flag, MPI.SUM)
    except MPI.Exception as error:
        noticed = time.monotonic() - started
        comm.Revoke()
        survivors = comm.Shrink()
        comm = survivors
        comm.Set_errhandler(MPI.ERRORS_RETURN)
        recorder.rebuild(comm)
        # The same values on every survivor: the first to notice, the last to go on.
        failed = comm.allreduce(int(error.Get_error_class() == MPI.ERR_PROC_FAILED), MPI.MAX)
        clock = comm.allreduce(noticed, MPI.MIN)
        recovery = comm.allreduce(time.monotonic() - started - clock, MPI.MAX)
        how = "proc_failed" if failed else "revoked"
        recorder.record_membership(step=step, clock=clock, left=[0], noticed=how, recovery_s=recovery)
        continue  # the step again, on the survivors
    recorder.record(step, **dict.fromkeys(STEP_FIELDS, 1000.0 * world.rank + step))
    step += 1
if comm.rank == 0:
    recorder.record_tables({"t": (np.array([[9.0, 9.0]]), ["a", "b"])})
recorder.close("complete")
