"""Flat parameter buffers: a model's parameters and gradients as views into one tensor per dtype."""

from collections import OrderedDict

import torch

__all__ = ["FlatParameters"]


class FlatParameters:
    """The trainable parameters of ``module`` as views into one contiguous tensor per dtype.

    After construction every trainable parameter ``p`` of ``module``
    (``requires_grad``; each shared parameter once, in
    ``module.parameters()`` order) has
    ``p.data = flat[p.dtype][offset:offset + p.numel()].view(p.shape)`` on the
    module's device, so an averaging step is one message per dtype, not one
    per tensor, and whatever the communication writes into ``flat`` is the
    model.  With ``grads=True`` the gradients are views into ``flat_grads``
    the same way; autograd accumulates into an existing ``.grad`` in place, so
    ``backward()`` fills the flat gradient buffer directly.

    Frozen parameters (``requires_grad=False``) stay out: they keep their
    own storage, their gradient stays None, and nothing that communicates or
    averages the flat buffers touches them.  The set of trainable parameters
    is the one at construction, as in DDP.

    Buffers (BatchNorm running statistics, ``num_batches_tracked``) are not
    parameters: they stay where they are, are listed in :attr:`buffers`, and
    each algorithm says what it does with them.

    .. warning::
        ``optimizer.zero_grad()`` sets gradients to None by default, and the
        next ``backward()`` then allocates fresh tensors that are not views.
        Call :meth:`zero_grad` instead (an algorithm's ``algo.zero_grad()``),
        or :meth:`attach_grads` after ``backward()``; :meth:`check_views`
        raises if a view was replaced.

    Memory: the flat buffers replace the parameters' own storage (the old
    tensors are released), so the cost is a transient second copy during
    construction.

    Args:
        module: a ``torch.nn.Module`` whose parameters are all on one device.
        grads: also flatten the gradients.

    Raises:
        ValueError: the module has no trainable parameters, or they are on several devices.

    Example::

        flat = FlatParameters(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loss.backward()
        for tensor in flat.grads.values():
            allreduce(tensor, comm=comm, op="avg")   # one message per dtype
        optimizer.step()
    """

    def __init__(self, module: torch.nn.Module, *, grads: bool = True) -> None:
        parameters = [p for p in module.parameters() if p.requires_grad]  # shared parameters once
        if not parameters:
            raise ValueError("module has no trainable parameters to flatten")
        devices = sorted({str(p.device) for p in parameters})
        if len(devices) > 1:
            raise ValueError(f"parameters must all be on one device, got {', '.join(devices)}")
        self.device = parameters[0].device
        self.parameters = parameters
        self.names = {id(p): name for name, p in module.named_parameters()}
        #: The module's buffers by name, which stay in their own storage.
        self.buffers = OrderedDict(module.named_buffers())
        self.params: OrderedDict[torch.dtype, torch.Tensor] = OrderedDict()
        #: The flat gradient tensor of each dtype (None without ``grads``).
        self.grads: OrderedDict[torch.dtype, torch.Tensor] | None = OrderedDict() if grads else None
        self._slices: list[tuple[torch.nn.Parameter, torch.dtype, int]] = []  # (parameter, dtype, offset)
        sizes: OrderedDict[torch.dtype, int] = OrderedDict()
        for p in parameters:
            offset = sizes.get(p.dtype, 0)
            self._slices.append((p, p.dtype, offset))
            sizes[p.dtype] = offset + p.numel()
        for dtype, total in sizes.items():
            self.params[dtype] = torch.empty(total, dtype=dtype, device=self.device)
            if self.grads is not None:
                self.grads[dtype] = torch.zeros(total, dtype=dtype, device=self.device)
        with torch.no_grad():
            for p, dtype, offset in self._slices:
                view = self._view(self.params, p, dtype, offset)
                view.copy_(p.data)
                p.data = view
        if grads:
            self.attach_grads()

    @staticmethod
    def _view(flat, p, dtype, offset):
        return flat[dtype][offset : offset + p.numel()].view(p.shape)

    @property
    def numel(self) -> int:
        """Elements over all dtypes."""
        return sum(t.numel() for t in self.params.values())

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.params.values())

    def attach_grads(self) -> None:
        """Make every ``p.grad`` a view into :attr:`grads` again.

        A gradient that was set to None becomes a zeroed view; one that
        autograd allocated anew is copied into its view first, so nothing
        ``backward()`` computed is lost.
        """
        if self.grads is None:
            raise RuntimeError("FlatParameters was built with grads=False")
        with torch.no_grad():
            for p, dtype, offset in self._slices:
                view = self._view(self.grads, p, dtype, offset)
                if p.grad is None:
                    view.zero_()
                elif not _same_memory(p.grad, view):
                    view.copy_(p.grad)
                else:
                    continue
                p.grad = view

    def rebind(
        self, dtype: torch.dtype, *, params: torch.Tensor | None = None, grads: torch.Tensor | None = None
    ) -> None:
        """Make ``params`` (and/or ``grads``) the flat buffer of ``dtype``:
        every parameter (gradient) of that dtype becomes a view into it.

        For collectives that hand back their result in another buffer (the
        wait-avoiding group allreduce keeps the one it was given as the
        published contribution): the model moves to the result instead of
        the result being copied into the model.  O(number of parameters),
        no data is copied; optimizer state (keyed by parameter) is kept.

        Raises:
            ValueError: a buffer of another dtype, size or device.
        """
        with torch.no_grad():
            for flat, tensor, attribute in ((self.params, params, "data"), (self.grads, grads, "grad")):
                if tensor is None:
                    continue
                if flat is None:
                    raise RuntimeError("FlatParameters was built with grads=False")
                old = flat[dtype]
                if (tensor.dtype, tensor.shape, tensor.device) != (
                    old.dtype,
                    old.shape,
                    old.device,
                ) or not tensor.is_contiguous():
                    raise ValueError(
                        f"rebind needs a contiguous {old.dtype} tensor of "
                        f"{old.numel()} elements on {old.device}, got {tensor.dtype} "
                        f"{tuple(tensor.shape)} on {tensor.device}"
                    )
                flat[dtype] = tensor
                for p, d, offset in self._slices:
                    if d == dtype:
                        setattr(p, attribute, self._view(flat, p, d, offset))

    def zero_grad(self) -> None:
        """Zero the flat gradients, keeping every ``p.grad`` a view."""
        self.attach_grads()
        assert self.grads is not None  # attach_grads raised otherwise
        for tensor in self.grads.values():
            tensor.zero_()

    def check_views(self) -> None:
        """Raise ``RuntimeError`` naming a parameter (or gradient) that no
        longer views the flat buffer, e.g. after ``p.data = ...``."""
        for p, dtype, offset in self._slices:
            if not _same_memory(p.data, self._view(self.params, p, dtype, offset)):
                raise RuntimeError(
                    f"parameter {self.names.get(id(p), '?')} no longer views the flat buffer (was p.data replaced?)"
                )
            if (
                self.grads is not None
                and p.grad is not None
                and not _same_memory(p.grad, self._view(self.grads, p, dtype, offset))
            ):
                raise RuntimeError(
                    f"gradient of {self.names.get(id(p), '?')} is not a "
                    f"view of the flat buffer (optimizer.zero_grad() sets it to "
                    f"None): zero the gradients with algo.zero_grad(), or call "
                    f"attach_grads() after backward()"
                )

    def __repr__(self) -> str:
        parts = ", ".join(f"{str(d).removeprefix('torch.')}: {t.numel()}" for d, t in self.params.items())
        return f"FlatParameters({len(self.parameters)} parameters on {self.device}; {parts})"


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()
