"""WAGMA Algorithm 1's worked example run through the group allreduce: ``mpiexec -n 8 python -m mpi4py -m
experiments.reproduce.group_example OUT.h5``.

Rank r contributes the unit vector e_r of length P; the blocking group
allreduce (``collectives.wait_avoiding.group_allreduce``, S = 4, op sum) of iterations
t = 0 and t = 1 returns on each rank the indicator of its group, which rank
0 gathers: the groups are read from what the runtime reduced, exactly (sums
of zeros and ones).
"""

import sys

import h5py
import numpy as np
from mpi4py import MPI

from collectives import Communicator, group_allreduce

GROUP_SIZE, ITERATIONS = 4, (0, 1)


def main(argv=None):
    out = (argv if argv is not None else sys.argv[1:])[0]
    world = MPI.COMM_WORLD
    members = np.zeros((len(ITERATIONS), world.size, world.size))
    with Communicator(world) as comm:
        for i, t in enumerate(ITERATIONS):
            data = np.zeros(world.size)
            data[comm.rank] = 1.0
            group_allreduce(data, comm=comm, group_size=GROUP_SIZE, t=t, op="sum")
            members[i] = world.allgather(data)
    if world.rank == 0:
        with h5py.File(out, "w") as f:
            f["members"] = members
            f["members"].attrs["axes"] = "iteration (t = 0, 1), rank, rank: 1 where in the same group"
            f.attrs.update(ranks=world.size, group_size=GROUP_SIZE, iterations=np.array(ITERATIONS))


if __name__ == "__main__":
    main()
