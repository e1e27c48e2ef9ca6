"""Flat communication buffers: numpy arrays and torch tensors as 1-D element ranges.

The schedules see every user buffer as a :class:`FlatBuffer`: ``numel``
elements of one dtype, addressed by element ranges ``[lo, hi)``.  Messages
travel as raw bytes (``msg(lo, hi)``), so bfloat16 and other types that MPI
has no datatype for move like any other; reductions run in place with the
buffer's own library (``np.add(..., out=...)`` for numpy, ``Tensor.add_`` for
torch, on the tensor's device), never element by element in Python.

CUDA tensors take one of two paths (see :func:`open_buffer`): with a
CUDA-aware MPI the device memory itself is handed to MPI; otherwise the
tensor is copied to a pinned host tensor, reduced there, and copied back.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NamedTuple, Optional, TypeAlias, TypeGuard, TypeVar

import numpy as np

if TYPE_CHECKING:
    import torch

__all__ = [
    "Buffer",
    "BufferInfo",
    "BufferT",
    "LikeT",
    "address",
    "copy_into",
    "copy_of",
    "empty_like",
    "FlatBuffer",
    "SUPPORTED_DTYPES",
    "StagingArea",
    "Workspace",
    "describe",
    "dtype_name",
    "open_buffer",
    "zeros_like",
]

#: dtype names the schedules accept, for numpy arrays and torch tensors
#: alike (numpy has no bfloat16; torch tensors of that type are accepted).
SUPPORTED_DTYPES = ("float16", "bfloat16", "float32", "float64", "int32", "int64")

#: What the collectives take as a buffer, a numpy array or a torch tensor
#: (for annotations only: torch is imported by type checkers alone).
Buffer: TypeAlias = "np.ndarray | torch.Tensor"
#: A buffer passed in and handed back (the same object).
BufferT = TypeVar("BufferT", bound="np.ndarray | torch.Tensor")
#: A buffer of one library, where new ones are made like it or several are
#: combined: an array gives arrays, a tensor tensors.
LikeT = TypeVar("LikeT", np.ndarray, "torch.Tensor")


def _torch_or_none() -> Any:
    # collectives never imports torch itself: a tensor can only exist if the
    # caller already imported it.  (Any: the module, or None where no tensor can exist.)
    return sys.modules.get("torch")


def _is_tensor(data: object) -> TypeGuard[torch.Tensor]:
    torch = _torch_or_none()
    return torch is not None and isinstance(data, torch.Tensor)


class BufferInfo(NamedTuple):
    """What :func:`describe` found out about a candidate buffer."""

    problem: Optional[str]  # None for a usable buffer
    error: type[Exception]  # the exception ``problem`` calls for
    numel: int
    dtype: str


@functools.cache
def dtype_name(dtype: Any) -> str:
    """The name of a numpy or torch dtype as :data:`SUPPORTED_DTYPES` spells
    it (``float32``, ``bfloat16``), found once per dtype: numpy builds
    ``str(dtype)`` anew each time (about 3 us), and every collective's call
    asks for it."""
    return str(dtype).removeprefix("torch.")


def describe(data: object) -> BufferInfo:
    """Check a candidate buffer without raising.

    ``problem`` is None for a usable buffer, else a sentence saying why it is
    not (unsupported type or dtype, not contiguous).  Nothing is raised, so
    that the caller can share the verdict with the other ranks before any of
    them moves data.
    """
    if isinstance(data, np.ndarray):
        dtype, contiguous = dtype_name(data.dtype), data.flags.c_contiguous
    elif _is_tensor(data):
        dtype = dtype_name(data.dtype)
        contiguous = data.is_contiguous()
    else:
        return BufferInfo(
            f"buffer must be a numpy.ndarray or torch.Tensor, got {type(data).__name__}", TypeError, -1, "?"
        )
    numel = int(data.size) if isinstance(data, np.ndarray) else data.numel()
    if dtype not in SUPPORTED_DTYPES:
        return BufferInfo(
            f"buffer dtype must be one of {', '.join(SUPPORTED_DTYPES)}, got {dtype}", TypeError, numel, dtype
        )
    if not contiguous:
        return BufferInfo(
            "buffer must be contiguous (C order); pass a contiguous copy or a flat parameter buffer",
            ValueError,
            numel,
            dtype,
        )
    return BufferInfo(None, ValueError, numel, dtype)


class FlatBuffer:
    """A contiguous buffer seen as ``numel`` elements of one dtype.

    Subclasses bind one array library; the schedules use only these methods.
    """

    numel: int
    dtype: str
    is_integer: bool
    _bytes: Buffer  # the elements as bytes: a numpy uint8 array, or a uint8 torch tensor on the device
    _itemsize: int

    @property
    def nbytes(self) -> int:
        """The size of the buffer in bytes."""
        return self.numel * self._itemsize

    def msg(self, lo: int, hi: int) -> Buffer:
        """The bytes of elements ``[lo, hi)``, as an MPI buffer."""
        return self._bytes[lo * self._itemsize : hi * self._itemsize]

    def scratch(self, numel: int) -> FlatBuffer:
        """A temporary of ``numel`` elements of the same dtype and device.

        It lives in the communicator's :class:`Workspace` and stays valid
        until the next call of ``scratch``: a schedule holds one at a time.
        """
        raise NotImplementedError

    def add_(self, lo: int, hi: int, other: FlatBuffer, at: int = 0) -> None:
        """``self[lo:hi] += other[at:at + hi - lo]``, in place."""
        raise NotImplementedError

    def copy_(self, other: FlatBuffer) -> None:
        """``self[:] = other[:]`` (same ``numel``)."""
        raise NotImplementedError

    def scale_(self, lo: int, hi: int, factor: float) -> None:
        """``self[lo:hi] *= factor``, in place (floating dtypes only)."""
        raise NotImplementedError

    def host_array(self) -> np.ndarray | None:
        """The elements as a numpy array over the same memory, or None for
        device memory (what compressed averaging encodes and decodes)."""
        raise NotImplementedError


class _NumpyBuffer(FlatBuffer):
    def __init__(self, array: np.ndarray, workspace: "Workspace"):
        self._workspace = workspace
        self._typed = array.reshape(-1)
        self._bytes = self._typed.view(np.uint8)
        self._itemsize = array.itemsize
        self.numel = self._typed.size
        self.dtype = dtype_name(array.dtype)
        self.is_integer = array.dtype.kind in "iu"

    def scratch(self, numel):
        raw = self._workspace.bytes_for(np.uint8, numel * self._itemsize, None)
        return _NumpyBuffer(raw.view(self._typed.dtype), self._workspace)

    def add_(self, lo, hi, other, at=0):
        dst = self._typed[lo:hi]
        np.add(dst, other._typed[at : at + hi - lo], out=dst)

    def copy_(self, other):
        np.copyto(self._typed, other._typed)

    def scale_(self, lo, hi, factor):
        dst = self._typed[lo:hi]
        np.multiply(dst, factor, out=dst)

    def host_array(self):
        return self._typed


class _TorchBuffer(FlatBuffer):
    def __init__(self, tensor, workspace: "Workspace"):
        torch = _torch_or_none()
        self._workspace = workspace
        # An empty tensor may have stride 0 (from_numpy), which torch cannot
        # view as bytes; an empty one of its own has nothing to lose.
        self._typed = tensor.view(-1) if tensor.numel() else tensor.new_empty(0)
        raw = self._typed.view(torch.uint8)
        # CPU tensors travel as numpy views (zero copy); CUDA tensors as
        # device tensors, which mpi4py passes to a CUDA-aware MPI through
        # __cuda_array_interface__ / DLPack.
        self._bytes = raw if tensor.is_cuda else raw.numpy()
        self._itemsize = tensor.element_size()
        self._cuda = tensor.is_cuda
        self.numel = tensor.numel()
        self.dtype = dtype_name(tensor.dtype)
        self.is_integer = not tensor.is_floating_point()

    def scratch(self, numel):
        torch = _torch_or_none()
        raw = self._workspace.bytes_for(torch.uint8, numel * self._itemsize, self._typed.device)
        return _TorchBuffer(raw.view(self._typed.dtype), self._workspace)

    def _sync(self):
        # MPI reads device memory behind the stream's back: the reduction
        # queued on the stream must have finished before the next send.
        if self._cuda:
            _torch_or_none().cuda.current_stream(self._typed.device).synchronize()

    def add_(self, lo, hi, other, at=0):
        self._typed[lo:hi].add_(other._typed[at : at + hi - lo])
        self._sync()

    def copy_(self, other):
        self._typed.copy_(other._typed)
        self._sync()

    def scale_(self, lo, hi, factor):
        self._typed[lo:hi].mul_(factor)
        self._sync()

    def host_array(self):
        return None if self._cuda else self._typed.numpy()


class Workspace:
    """Scratch memory reused across calls, one growing block per device.

    Host allocations above glibc's mmap threshold (at most 32 MiB) come as
    fresh pages that fault in on every call: reusing the block made
    recursive doubling 1.23x and RHD's fold 1.29x faster at 64 MiB (docs/benchmarks.md,
    "Allreduce benchmark").  A communicator keeps one block per device and
    hands out views of its first bytes.
    """

    def __init__(self) -> None:
        self._blocks: dict[torch.device | None, Buffer] = {}

    def bytes_for(self, uint8: Any, nbytes: int, device: torch.device | None) -> Buffer:
        """The first ``nbytes`` of this device's block (numpy if ``device``
        is None, else torch), grown when too small.  ``uint8`` is the
        library's byte type: ``np.uint8`` or ``torch.uint8``."""
        block = self._blocks.get(device)
        if block is None or len(block) < nbytes:
            if device is None:
                block = np.empty(nbytes, dtype=uint8)
            else:
                block = _torch_or_none().empty(nbytes, dtype=uint8, device=device)
            self._blocks[device] = block
        return block[:nbytes]

    def clear(self) -> None:
        self._blocks.clear()


class StagingArea:
    """Pinned host tensors reused across calls, pooled by (dtype, numel).

    Pinned allocations cost milliseconds, far more than a small collective,
    so a communicator keeps the host copies of its device buffers; several
    buffers of one shape may be staged at once (each gets its own).
    """

    def __init__(self) -> None:
        self._free: dict[tuple[torch.dtype, int], list[torch.Tensor]] = {}

    def acquire(self, tensor: torch.Tensor) -> torch.Tensor:
        """A pinned host tensor holding a copy of the CUDA ``tensor``."""
        torch = _torch_or_none()
        free = self._free.setdefault((tensor.dtype, tensor.numel()), [])
        host = free.pop() if free else torch.empty(tensor.numel(), dtype=tensor.dtype, pin_memory=True)
        host.copy_(tensor.reshape(-1))
        return host

    def release(self, host: torch.Tensor) -> None:
        self._free.setdefault((host.dtype, host.numel()), []).append(host)

    def clear(self) -> None:
        self._free.clear()


@contextlib.contextmanager
def open_buffer(
    data: Buffer, *, cuda_aware: bool, staging: StagingArea, workspace: Workspace, writeback: bool = True
) -> Iterator[FlatBuffer]:
    """Yield a :class:`FlatBuffer` over ``data``; results land in ``data``.

    ``data`` must already have passed :func:`describe`; scratch space comes
    from ``workspace``.  A CUDA tensor is
    used directly when ``cuda_aware``; otherwise it is copied to a pinned
    host tensor from ``staging`` (the copy synchronises the stream), the
    schedule runs on the host copy, and the result is copied back on exit
    unless ``writeback`` is False (a buffer the schedule only reads: another
    thread may be reading ``data`` meanwhile).
    """
    if isinstance(data, np.ndarray):
        yield _NumpyBuffer(data, workspace)
        return
    if not data.is_cuda:
        yield _TorchBuffer(data, workspace)
        return
    torch = _torch_or_none()
    if cuda_aware:
        torch.cuda.current_stream(data.device).synchronize()
        yield _TorchBuffer(data, workspace)
        return
    host = staging.acquire(data)
    try:
        yield _TorchBuffer(host, workspace)
        if writeback:
            data.view(-1).copy_(host)
    finally:
        staging.release(host)


def empty_like(data: LikeT) -> LikeT:
    """A new uninitialised buffer of the same library, dtype, shape and device."""
    if isinstance(data, np.ndarray):
        return np.empty_like(data)
    return _torch_or_none().empty_like(data)


def copy_of(data: LikeT) -> LikeT:
    """A new buffer of the same library, dtype, shape and device holding a copy of ``data``."""
    buffer = empty_like(data)
    copy_into(buffer, data)
    return buffer


def zeros_like(data: LikeT) -> LikeT:
    """A new buffer of zeros of the same library, dtype, shape and device."""
    buffer = empty_like(data)
    buffer[...] = 0
    return buffer


def address(data: Buffer) -> int:
    """The address of the first element of a numpy array or torch tensor
    (two views of the same memory have the same address)."""
    if isinstance(data, np.ndarray):
        return data.__array_interface__["data"][0]
    return data.data_ptr()


def copy_into(dst: LikeT, src: LikeT) -> None:
    """Copy ``src`` into ``dst`` (same library, element count and dtype)."""
    if isinstance(dst, np.ndarray):
        np.copyto(dst, src.reshape(dst.shape), casting="no")
    else:
        dst.copy_(src.view(dst.shape))
