"""Calls whose output is not simply what they return, keyed by readable function name.

Each entry maps ``(args, result)`` to the ``[(path, tensor), ...]`` that the call produced.
``x[i] = y`` returns ``None`` but produces a new value of ``x``; add such calls here rather
than branching inside the capture mode.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["SPECIAL_OUTPUTS"]

Outputs = list[tuple[str, torch.Tensor]]


def _written_first_argument(args: tuple, result: Any) -> Outputs:
    """``setitem`` writes into its first argument and returns nothing."""
    target = args[0] if args else None
    return [("0", target)] if isinstance(target, torch.Tensor) else []


SPECIAL_OUTPUTS: dict[str, Callable[[tuple, Any], Outputs]] = {
    "setitem": _written_first_argument,
}
