"""The communication layer without a launcher: partitions, buffers, CUDA query, thread level."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from collectives import block_offsets
from collectives.buffers import StagingArea, Workspace, describe, open_buffer
from collectives.cuda import ENV_CUDA_AWARE, mpi_is_cuda_aware


@pytest.mark.parametrize("parts", [1, 2, 3, 5, 8, 13])
@pytest.mark.parametrize("numel", [0, 1, 2, 7, 8, 100, 1001])
def test_block_offsets_cover_in_near_equal_blocks(numel, parts):
    off = block_offsets(numel, parts)
    sizes = np.diff(off)
    assert off[0] == 0 and off[-1] == numel and len(sizes) == parts
    assert sizes.max() - sizes.min() <= 1 and np.all(sizes[:-1] >= sizes[1:])
    np.testing.assert_array_equal(sizes, [len(a) for a in np.array_split(np.arange(numel), parts)])


def test_describe_accepts_supported_buffers():
    for data in (
        np.zeros(3, np.float32),
        np.zeros((2, 3), np.int64),
        torch.zeros(4, dtype=torch.bfloat16),
        torch.zeros(2, 2),
    ):
        info = describe(data)
        assert info.problem is None and info.numel == np.prod(data.shape)


@pytest.mark.parametrize(
    "data, error, text",
    [
        (np.zeros((4, 4))[:, 1], ValueError, "contiguous"),
        (torch.zeros(4, 4).t(), ValueError, "contiguous"),
        (np.zeros(3, dtype=np.uint8), TypeError, "dtype must be one of"),
        (torch.zeros(3, dtype=torch.complex64), TypeError, "got complex64"),
        ([1.0, 2.0], TypeError, "numpy.ndarray or torch.Tensor, got list"),
    ],
)
def test_describe_names_the_problem(data, error, text):
    info = describe(data)
    assert info.error is error and text in info.problem


def test_workspace_reuses_its_block():
    workspace = Workspace()
    with open_buffer(np.zeros(10), cuda_aware=False, staging=StagingArea(), workspace=workspace) as buf:
        first = buf.scratch(8)
        second = buf.scratch(4)
    assert np.shares_memory(first._typed, second._typed)
    assert first.numel == 8 and second.numel == 4 and second.dtype == "float64"


def test_cuda_awareness_environment_override(monkeypatch):
    for value, expected in (("1", True), ("0", False)):
        monkeypatch.setenv(ENV_CUDA_AWARE, value)
        mpi_is_cuda_aware.cache_clear()
        assert mpi_is_cuda_aware() is expected
    monkeypatch.setenv(ENV_CUDA_AWARE, "yes")
    mpi_is_cuda_aware.cache_clear()
    with pytest.raises(ValueError, match=f"{ENV_CUDA_AWARE} must be '0' or '1'"):
        mpi_is_cuda_aware()
    monkeypatch.delenv(ENV_CUDA_AWARE)
    mpi_is_cuda_aware.cache_clear()
    # The MPICH wheel exports MPIX_Query_cuda_support and is built without CUDA.
    assert mpi_is_cuda_aware() is False


@pytest.mark.parametrize(
    "needs_multiple",
    [
        "Communicator(thread_level=MPI.THREAD_MULTIPLE)",
        "WaitAvoidingGroupAllreduce(MPI.COMM_WORLD, np.zeros(4), group_size=1).open()",
    ],
)
def test_thread_level_below_need_is_refused(needs_multiple):
    # MPI initialised with MPI_THREAD_SERIALIZED in a fresh (singleton) process.
    code = (
        "import mpi4py; mpi4py.rc.thread_level = 'serialized'\n"
        "from mpi4py import MPI\n"
        "import numpy as np\n"
        "from collectives import Communicator, WaitAvoidingGroupAllreduce\n"
        f"{needs_multiple}\n"
    )
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode != 0
    assert ("needs MPI_THREAD_MULTIPLE but MPI was initialised with MPI_THREAD_SERIALIZED") in done.stderr


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("cuda_aware", [False, True])
def test_cuda_tensor_round_trip_on_one_rank(cuda_aware):
    # One rank: the schedule is a no-op, so this checks the staging copy (or
    # the direct path) leaves the data intact on the device.
    from collectives import Communicator, allreduce

    if cuda_aware and not mpi_is_cuda_aware():
        pytest.skip("the MPI library is not CUDA-aware")
    x = torch.arange(1000, dtype=torch.float32, device="cuda")
    with Communicator() as comm:
        allreduce(x, comm=comm, algorithm="ring")
    assert x.is_cuda
    torch.testing.assert_close(x.cpu(), torch.arange(1000, dtype=torch.float32))
