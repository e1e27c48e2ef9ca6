"""Step time of our Allreduce-SGD against torch DDP (gloo) on the same model, same run.

``mpiexec -n 4 python -m mpi4py -m experiments.bench_allreduce_sgd``
"""

import argparse
import os
import time

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI
from torch.nn.parallel import DistributedDataParallel

from collectives import Communicator
from collectives.provenance import results_file, run_attributes
from wagma.algorithms import create
from wagma.torch_distributed import init_gloo

from .options import HelpFormatter

__all__ = ["main", "mlp"]


def mlp(width, depth, inputs=1024, classes=10):
    """An MLP of ``depth`` hidden layers of ``width`` units (10.5M parameters
    with the defaults: 1024 -> 2048 x 3 -> 10)."""
    layers, size = [], inputs
    for _ in range(depth):
        layers += [torch.nn.Linear(size, width), torch.nn.ReLU()]
        size = width
    return torch.nn.Sequential(*layers, torch.nn.Linear(size, classes))


def _step(model, opt, zero_grad, x, y):
    start = time.perf_counter()
    zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt()
    return time.perf_counter() - start


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog=".venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py -m experiments.bench_allreduce_sgd",
        description=__doc__.splitlines()[0],
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--width", type=int, default=2048, help="hidden width of the MLP")
    parser.add_argument("--depth", type=int, default=3, help="hidden layers of the MLP")
    parser.add_argument("--batch", type=int, default=32, help="per-rank batch size")
    parser.add_argument("--steps", type=int, default=20, help="timed steps of each implementation")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument("--bucket-cap-mb", type=float, default=25.0, help="gradient bucket size of both")
    parser.add_argument(
        "--out", default=None, help="HDF5 file [results/allreduce_sgd_vs_ddp/allreduce_sgd_vs_ddp_n{ranks}.h5]"
    )
    args = parser.parse_args(argv)
    if args.steps < 1 or not 0 <= args.warmup or args.width < 1 or args.depth < 1:
        parser.error("--steps >= 1, --warmup >= 0, --width >= 1 and --depth >= 1 needed")
    world = MPI.COMM_WORLD
    torch.set_num_threads(1)  # ranks share the cores; one compute thread each
    init_gloo(world)
    torch.manual_seed(0)
    ours_model, ddp_model = mlp(args.width, args.depth), mlp(args.width, args.depth)
    params = sum(p.numel() for p in ours_model.parameters())
    ours_opt = torch.optim.SGD(ours_model.parameters(), lr=0.01, momentum=0.9)
    ddp_opt = torch.optim.SGD(ddp_model.parameters(), lr=0.01, momentum=0.9)
    ddp = DistributedDataParallel(ddp_model, bucket_cap_mb=args.bucket_cap_mb)
    g = torch.Generator().manual_seed(world.rank)
    x = torch.randn(args.batch, 1024, generator=g)
    y = torch.randint(0, 10, (args.batch,), generator=g)
    seconds = np.zeros((2, args.steps))
    with Communicator(world) as comm:
        attrs = run_attributes(comm.data)
        with create("allreduce_sgd", ours_model, ours_opt, comm, bucket_cap_mb=args.bucket_cap_mb) as algo:
            for step in range(-args.warmup, args.steps):
                world.Barrier()
                a = _step(ours_model, algo.step, algo.zero_grad, x, y)
                world.Barrier()
                b = _step(ddp, ddp_opt.step, ddp_opt.zero_grad, x, y)
                if step >= 0:
                    seconds[:, step] = world.allreduce(a, op=MPI.MAX), world.allreduce(b, op=MPI.MAX)
    dist.destroy_process_group()
    if world.rank == 0:
        ours, theirs = np.median(seconds, axis=1) * 1e3
        print(
            f"Allreduce-SGD vs DDP (gloo): {world.size} ranks, {os.cpu_count()} cores, "
            f"MLP {params / 1e6:.1f}M parameters, batch {args.batch} per rank, "
            f"bucket {args.bucket_cap_mb:g} MB, median of {args.steps} steps"
        )
        print(f"  step time ours {ours:.1f} ms, DDP {theirs:.1f} ms, DDP / ours = {theirs / ours:.2f}")
        with results_file(
            args.out, os.path.join("allreduce_sgd_vs_ddp", f"allreduce_sgd_vs_ddp_n{world.size}.h5"), attrs
        ) as f:
            f.attrs.update(
                parameters=params,
                batch=args.batch,
                width=args.width,
                depth=args.depth,
                bucket_cap_mb=args.bucket_cap_mb,
                torch_version=str(torch.__version__),
                torch_threads=1,
            )
            f["step_seconds"] = seconds
            f["step_seconds"].attrs["axes"] = "implementation (ours, ddp_gloo), step; max over ranks"


if __name__ == "__main__":
    main()
