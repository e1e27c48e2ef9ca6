"""torch.distributed (gloo) on the ranks of an MPI communicator, for comparisons with PyTorch."""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

import torch.distributed as dist

if TYPE_CHECKING:
    from mpi4py import MPI

__all__ = ["init_gloo"]


def init_gloo(comm: MPI.Comm) -> None:
    """Start a gloo process group over the ranks of the mpi4py ``comm``.

    Rank 0 picks a free TCP port on the loopback interface and shares it
    over MPI, so it works wherever all ranks share one host (the reference
    runs of the tests and benchmarks); ``dist.destroy_process_group()`` ends
    it.  Collective over ``comm``.
    """
    port = None
    if comm.Get_rank() == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = comm.bcast(port)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=comm.Get_rank(), world_size=comm.Get_size()
    )
