"""Escapes: a recorded value read by Python (``.item()``, ``if t.any():``, ``.numpy()``...).

The capture mode sends the calls named in :data:`~torchlens.capture.naming.ESCAPES` here
from its pass-through branch, the one calls that give no tensor take, so the ops of the
forward pay nothing for it. Each call is run, then recorded by
:meth:`~torchlens.capture.builder.TraceBuilder.record_escape` (which record, which call,
the value, the model's line). Escapes are rare, so the line is always looked up.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from torchlens.capture.tree import flatten_call

__all__ = ["escape_call", "escaped_tensors", "EscapeHook", "type_name"]

# called as hook(call number, value) with the Python value an escape gave; returns the
# value the model gets instead (validation's completeness arm perturbs escaped values)
EscapeHook = Callable[[int, Any], Any]


def escape_call(builder: Any, via: str, func: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """Run an escaping call and record it: the value goes back to the model as it is
    (or as the builder's ``escape_hook`` replaces it)."""
    value = func(*args, **kwargs) if kwargs else func(*args)
    tensors = escaped_tensors(args, kwargs)
    return builder.record_escape(via, tensors, value) if tensors else value


def escaped_tensors(args: tuple, kwargs: dict | None) -> list[torch.Tensor]:
    """The tensors whose values an escaping call reads, in the order they are recorded."""
    return [t for _, t in flatten_call(args, kwargs or {})[0] if isinstance(t, torch.Tensor)]


def type_name(value: Any) -> str:
    """The type an escape gave, as recorded (``"ndarray"`` for NumPy arrays)."""
    return "ndarray" if isinstance(value, np.ndarray) else type(value).__name__
