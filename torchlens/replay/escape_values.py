"""Perturbed escape values, and the plain forward that gives them to the model.

The completeness arm (``replay/completeness.py``) asks what a forward does when the Python
values its escapes gave (``.item()``, ``.tolist()``, ``bool(t)``...) are a little different.
:func:`perturbed` makes such a value: a float moves by 1% (and 1e-3), an int by one, a bool
flips, a list of ints keeps its sum (split sizes still add up), an array moves like its
elements. :class:`PerturbingMode` runs a plain forward under a function mode that replaces
the chosen escapes' values, and notes which escape calls ran: the cheap first look, before
any capture.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from typing import Any

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

from torchlens.capture.composite import opened_body
from torchlens.capture.mode import functorch_level
from torchlens.capture.naming import FUNC_INFOS, func_info
from torchlens.capture.special import SPECIAL_OUTPUTS

__all__ = ["UNCHANGED", "perturbed", "Plan", "PerturbingMode", "recorded_calls"]

UNCHANGED = object()  # what perturbed() gives for a value it has no way to move (text)
_RELATIVE, _ABSOLUTE = 1e-2, 1e-3


def perturbed(value: Any) -> Any:
    """``value`` a little different, of the same type and shape; :data:`UNCHANGED` for a
    value that cannot be moved (a string, a capsule)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value - 1 if value > 0 else value + 1
    if isinstance(value, (float, complex)):
        if isinstance(value, float) and not math.isfinite(value):
            return UNCHANGED
        return value + (abs(value) * _RELATIVE + _ABSOLUTE)
    if isinstance(value, list):
        return _list(value)
    if isinstance(value, np.ndarray):
        return _array(value)
    return UNCHANGED


def _list(values: list) -> Any:
    if values and all(type(v) is int for v in values) and len(values) > 1:
        moved = list(values)  # sizes: one unit moves from the largest to another element
        big = max(range(len(moved)), key=moved.__getitem__)
        other = min(range(len(moved)), key=moved.__getitem__)
        other = other if other != big else (big + 1) % len(moved)
        if moved[big] > 0:
            moved[big] -= 1
            moved[other] += 1
            return moved
    items = [perturbed(v) for v in values]
    if all(item is UNCHANGED for item in items) and items:
        return UNCHANGED
    return [v if item is UNCHANGED else item for v, item in zip(values, items)]


def _array(array: np.ndarray) -> Any:
    if array.dtype == np.bool_:
        return ~array
    if np.issubdtype(array.dtype, np.integer):
        return array + np.where(array > 0, -1, 1).astype(array.dtype)
    if np.issubdtype(array.dtype, np.inexact):
        return (array + (np.abs(array) * _RELATIVE + _ABSOLUTE)).astype(array.dtype)
    return UNCHANGED


class Plan:
    """Which escape calls get perturbed values: ``calls`` (escape call numbers, or None
    for all); the others give their own. Called as an escape hook, ``plan(call, value)``."""

    def __init__(self, calls: Collection[int] | None) -> None:
        self.calls = None if calls is None else frozenset(calls)  # None: every call
        self.moved: set[int] = set()  # the calls whose values it changed

    def __call__(self, call: int, value: Any) -> Any:
        if self.calls is not None and call not in self.calls:
            return value
        new = perturbed(value)
        if new is UNCHANGED:
            return value
        self.moved.add(call)
        return new


def _makes_tensors(name: str, result: Any) -> bool:
    """Whether the capture would record the call (it produced a tensor)."""
    if isinstance(result, torch.Tensor) or name in SPECIAL_OUTPUTS:
        return True
    return isinstance(result, (tuple, list)) and any(isinstance(r, torch.Tensor) for r in result)


def recorded_calls(trace: Any) -> list[str]:
    """The names of the calls a trace recorded, one per call (what
    :attr:`PerturbingMode.calls` lists for a plain forward of the same code path)."""
    names: list[str] = []
    last = None
    for op in trace.ops:
        if op.call_index != last and op.func is not None:
            names.append(op.func_name)
        last = op.call_index
    return names


class PerturbingMode(TorchFunctionMode):
    """A plain forward (nothing recorded) whose escapes give ``plan``'s values; ``vias``
    lists the escape calls that ran, as ``Escape.via``, and ``calls`` the names of the
    calls a capture would have recorded (see :func:`recorded_calls`). Composite functions
    the capture opens are opened here too, so escapes are numbered as the capture did."""

    def __init__(self, plan: Callable[[int, Any], Any]) -> None:
        super().__init__()
        self.plan = plan
        self.vias: list[str] = []
        self.calls: list[str] = []  # the calls the capture would record, by name
        self.at: list[int] = []  # per escape call, how many of those ran before it
        self._level = functorch_level()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        try:
            info = FUNC_INFOS[func]
        except (KeyError, TypeError):
            info = func_info(func)
        if info.opens and (info.opens is True or info.opens(args, kwargs)):
            torch._C._push_on_torch_function_stack(self)
            try:
                return opened_body(func)(*args, **kwargs)
            finally:
                torch._C._pop_torch_function_stack()
        result = func(*args, **kwargs)
        if functorch_level() != self._level:
            return result
        if not info.never_tensor and _makes_tensors(info.name, result):
            self.calls.append(info.name)
        if info.escape is None:
            return result
        if not any(isinstance(a, torch.Tensor) for a in (*args, *kwargs.values())):
            return result
        self.vias.append(info.escape)
        self.at.append(len(self.calls))
        return self.plan(len(self.vias) - 1, result)
