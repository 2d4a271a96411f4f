"""Facts about a live tensor (and where it sits in its storage) that capture, replay and
grads all need, in one place."""

from __future__ import annotations

import torch

__all__ = ["version_of", "storage_key", "geometry_end"]


def version_of(tensor: torch.Tensor) -> int | None:
    """A tensor's version counter; ``None`` for inference tensors, which have none."""
    try:
        return tensor._version
    except RuntimeError:
        return None


def storage_key(tensor: torch.Tensor) -> tuple[torch.device, int] | None:
    """What identifies the memory a tensor lives in (views of it share the key); ``None``
    for tensors without a plain storage (sparse, nested, meta, functional)."""
    try:
        return (tensor.device, tensor.untyped_storage().data_ptr())
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
