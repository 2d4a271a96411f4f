"""Two facts about a live tensor that capture, replay and grads all need, in one place."""

from __future__ import annotations

import torch

__all__ = ["version_of", "storage_key"]


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
