"""Autocast state at each op, so replay runs an op under the same mixed-precision rules.

Stored in ``op.meta["autocast"]`` as JSON-friendly ``[[device_type, dtype_name], ...]``;
absent when no autocast region was active (the common case costs one C call per op).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager

import torch

__all__ = ["any_autocast", "autocast_state", "autocast_applied"]

_DEVICE_TYPES = ("cpu", "cuda")
_any_enabled = getattr(torch._C, "_is_any_autocast_enabled", None)


def _enabled(device_type: str) -> bool:
    try:
        return torch.is_autocast_enabled(device_type)
    except TypeError:  # torch < 2.4 has per-device functions
        if device_type == "cpu":
            return torch.is_autocast_cpu_enabled()
        return torch.is_autocast_enabled()


def _dtype(device_type: str) -> torch.dtype:
    try:
        return torch.get_autocast_dtype(device_type)
    except (AttributeError, TypeError):
        if device_type == "cpu":
            return torch.get_autocast_cpu_dtype()
        return torch.get_autocast_gpu_dtype()


# Whether any autocast region may be active: one C call, for the per-op path (torch
# versions without it always answer "maybe", and autocast_state looks)
any_autocast: Callable[[], bool] = _any_enabled or (lambda: True)


def autocast_state() -> list[list[str]] | None:
    """The active autocast regions as ``[[device_type, dtype_name], ...]``, or None."""
    if not any_autocast():
        return None
    state = [
        [device, str(_dtype(device)).removeprefix("torch.")]
        for device in _DEVICE_TYPES
        if _enabled(device)
    ]
    return state or None


@contextmanager
def autocast_applied(state: Sequence[Sequence[str]] | None) -> Iterator[None]:
    """Run a block under exactly ``state``: the recorded regions on, every other one off."""
    wanted = {device: dtype for device, dtype in state or ()}
    with ExitStack() as stack:
        for device in _DEVICE_TYPES:
            if device == "cuda" and not torch.cuda.is_available() and device not in wanted:
                continue
            if device in wanted:
                dtype = getattr(torch, wanted[device])
                stack.enter_context(torch.autocast(device, dtype=dtype))
            elif _enabled(device):
                stack.enter_context(torch.autocast(device, enabled=False))
        yield
