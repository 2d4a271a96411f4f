"""Facts about a live tensor (and where it sits in its storage) that capture, replay and
grads all need, in one place."""

from __future__ import annotations

from collections.abc import Container

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

__all__ = [
    "copy_keeping_layout",
    "dense",
    "geometry",
    "geometry_end",
    "inner_of",
    "rewrap",
    "sharing",
    "storage_key",
    "version_of",
    "write_through",
]

Tensor = torch.Tensor


def inner_of(tensor: torch.Tensor) -> torch.Tensor | None:
    """The one tensor a traceable wrapper subclass holds (a ``DTensor``'s local shard): its
    elements are what this process has. None for a plain tensor, any other subclass, or a
    wrapper of several tensors."""
    if type(tensor) is torch.Tensor or not is_traceable_wrapper_subclass(tensor):
        return None
    names, _ = tensor.__tensor_flatten__()
    inner = [v for v in (getattr(tensor, n) for n in names) if isinstance(v, torch.Tensor)]
    return inner[0] if len(inner) == 1 else None


def rewrap(like: torch.Tensor, inner: torch.Tensor) -> torch.Tensor:
    """A wrapper like ``like`` (same subclass, metadata, outer shape) around ``inner`` in
    place of the tensor ``like`` holds (see :func:`inner_of`)."""
    names, context = like.__tensor_flatten__()
    parts = {}
    for name in names:
        part = getattr(like, name)
        parts[name] = inner if isinstance(part, torch.Tensor) else part
    return type(like).__tensor_unflatten__(parts, context, like.size(), like.stride())


def version_of(tensor: torch.Tensor) -> int | None:
    """A tensor's version counter; ``None`` for inference tensors, which have none."""
    try:
        return tensor._version
    except RuntimeError:
        return None


def storage_key(tensor: torch.Tensor) -> int | None:
    """What identifies the storage a tensor lives in (views of it share the key; so do its
    values after a ``resize_`` moved them); ``None`` for tensors without a plain storage
    (sparse, nested, functional).

    It is the address of torch's storage object, read without making a Python storage
    object (``untyped_storage()`` makes one per tensor, kept alive with the tensor: on
    the capture's path, a third of this call and an object per op for the collector).
    """
    try:
        return storage_address(tensor)
    except (RuntimeError, NotImplementedError):
        return None


def sharing(tensors: list[torch.Tensor | None], keys: Container[int]) -> list[torch.Tensor]:
    """Those of ``tensors`` (``None`` skipped) whose :func:`storage_key` is in ``keys``: one
    pass without a Python call per tensor (a model's every weight, at the end of a record)."""
    try:
        return [t for t in tensors if t is not None and storage_address(t) in keys]
    except (RuntimeError, NotImplementedError):  # a tensor without a plain storage
        return [t for t in tensors if t is not None and storage_key(t) in keys]


def _untyped_storage_address(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage()._cdata  # the same address, through the storage object


# private to torch, present since 2.0; the public route where it is gone
storage_address = getattr(torch._C, "_storage_address", _untyped_storage_address)


def geometry(tensor: torch.Tensor) -> tuple[tuple[int, ...], tuple[int, ...], int] | None:
    """``(shape, stride, storage_offset)``: where a tensor's elements sit in its storage;
    None without a plain storage (sparse, nested)."""
    try:
        return tuple(tensor.shape), tuple(tensor.stride()), tensor.storage_offset()
    except (RuntimeError, NotImplementedError):
        return None


def geometry_end(geometry: tuple) -> int:
    """One past the last storage element a ``(shape, stride, storage_offset)`` geometry
    reaches; its offset when it holds no element.

    Example:
        >>> geometry_end(((2, 3), (3, 1), 4)), geometry_end(((0, 3), (3, 1), 4))
        (10, 4)
    """
    shape, stride, offset = geometry
    if any(size == 0 for size in shape):
        return offset
    return offset + sum((size - 1) * step for size, step in zip(shape, stride)) + 1


def dense(geometry: tuple) -> bool:
    """Whether a geometry's elements fill consecutive storage slots from its offset, in
    some order (a contiguous tensor, or a permutation of one)."""
    shape, stride, _ = geometry
    expected = 1
    for step, size in sorted((step, size) for size, step in zip(shape, stride) if size != 1):
        if step != expected:
            return False
        expected *= size
    return True


def copy_keeping_layout(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of ``tensor`` with its strides. ``clone()`` keeps the strides of a dense
    tensor only: an expanded or a sliced one comes back contiguous, and kernels choose
    their path by layout (``linear`` fuses its bias only for some), so a value replayed
    from such a copy may round apart from what the forward computed. The storage span
    under the tensor is copied instead, and viewed the same way, unless the view is a
    small part of a large storage (then the contiguous copy)."""
    if tensor.is_contiguous() or not tensor.numel():
        return tensor.clone()
    try:
        start = tensor.storage_offset()
        span = geometry_end((tuple(tensor.shape), tensor.stride(), start)) - start
        if span > 4 * tensor.numel():
            return tensor.clone()
        flat = tensor.as_strided((span,), (1,), start).clone()
        return flat.as_strided(tensor.shape, tensor.stride(), 0)
    except (RuntimeError, NotImplementedError):  # no plain storage (sparse, nested)
        return tensor.clone()


def write_through(stale: Tensor, writes: list[tuple[Tensor, tuple]], base: tuple) -> Tensor:
    """``stale`` laid out in a scratch storage, each written value copied over its region
    in order, then read back.

    ``base`` and each region are ``(shape, stride, storage_offset)`` in the shared storage.
    A contiguous base holding every region (a loop writing slices of one tensor) is its
    own scratch: one copy of the stale value, then the writes.
    """
    geometries = [base, *(region for _, region in writes)]
    start = min(geometry[2] for geometry in geometries)
    extent = max(geometry_end(geometry) for geometry in geometries) - start
    if start == base[2] and extent == stale.numel() and stale.dim() and stale.is_contiguous():
        if base[1] == stale.stride():  # the base's own layout: contiguous, spanning all
            out = stale.clone(memory_format=torch.contiguous_format)
            for written, region in writes:
                out.as_strided(region[0], region[1], region[2] - start).copy_(written)
            return out
    scratch = stale.new_zeros(max(extent, 0))
    view = scratch.as_strided(base[0], base[1], base[2] - start)
    view.copy_(stale)
    for written, region in writes:
        scratch.as_strided(region[0], region[1], region[2] - start).copy_(written)
    return view.clone()
