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
from torchlens.capture.special import SETTLES, SPECIAL_OUTPUTS

__all__ = [
    "UNCHANGED",
    "perturbed",
    "Plan",
    "PerturbingMode",
    "Diverged",
    "recorded_calls",
    "recorded_groups",
    "fingerprint",
]

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


def recorded_groups(trace: Any) -> list[list[Any]]:
    """The ops a trace recorded from its first escape on, one list per function call (its
    outputs, in order): what :class:`PerturbingMode` sees as one call each."""
    groups: list[list[Any]] = []
    last = None
    for op in trace.ops[trace.escapes[0].index if trace.escapes else len(trace.ops) :]:
        if op.func is None:  # (a refresh: no call of the forward's)
            last = None
            continue
        if op.call_index != last:
            groups.append([])
        groups[-1].append(op)
        last = op.call_index
    return groups


def recorded_calls(trace: Any) -> list[str]:
    """The names of the calls a trace recorded from its first escape on, one per call
    (what :attr:`PerturbingMode.calls` lists for a plain forward of the same code path)."""
    return [ops[0].func_name for ops in recorded_groups(trace)]


def fingerprint(value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Two numbers that move when a tensor's values do: its sum and the sum of its
    magnitudes (the sum alone stays near zero for a normalised value), in float64, left
    on the value's device (no sync per op). None for a tensor with no plain values to sum
    (sparse, quantized, on the meta device, a dtype with no sum)."""
    try:
        if value.layout != torch.strided or value.is_meta or value.is_quantized:
            return None
        flat = value.detach()
    except Exception:  # noqa: BLE001 - a subclass without these: not compared
        return None
    if flat.is_floating_point():  # the usual case, in two kernels
        try:
            return flat.sum(dtype=torch.float64), _vector_norm(flat, 1, dtype=torch.float64)
        except Exception:  # noqa: BLE001 - float8, or no float64 (MPS): below
            pass
    for dtype in (torch.float64, torch.float32):
        try:
            real = torch.view_as_real(flat) if flat.is_complex() else flat
            real = real.to(torch.uint8) if real.dtype == torch.bool else real
            return real.sum(dtype=dtype), real.abs().sum(dtype=dtype)
        except Exception:  # noqa: BLE001 - no sum (float8, bits, a subclass): not compared
            continue
    return None


_vector_norm = torch.linalg.vector_norm


def _prints(name: str, result: Any) -> list[tuple | None] | None:
    """The fingerprints of a call's output tensors, in the order the capture records them."""
    if name in SPECIAL_OUTPUTS:
        return None
    if isinstance(result, torch.Tensor):
        return [fingerprint(result)]
    return [fingerprint(t) for t in result if isinstance(t, torch.Tensor)]


class Diverged(BaseException):
    """Raised inside a forward (by :class:`PerturbingMode`) to end it where it left the
    path of the unperturbed one: what it would do next is another branch's. A
    ``BaseException``, so a model's ``except Exception`` lets it through."""


class PerturbingMode(TorchFunctionMode):
    """A plain forward (nothing recorded) whose escapes give ``plan``'s values.

    From its first escape call on, it lists the escape calls that ran (``vias``, as
    ``Escape.via``) and the names of the calls a capture would have recorded (``calls``,
    see :func:`recorded_calls`; before the first escape nothing is perturbed yet, so
    nothing can differ). Composite functions the capture opens are opened here too, so
    escapes are numbered as the capture did.

    With ``expected`` (the mode of an unperturbed forward of the same call, which is how
    validation's ground-truth rerun runs), the forward stops, raising :class:`Diverged`,
    at the first place it leaves that forward's path: an escape call other than its, or
    another op after a perturbed bool. ``diverged`` then says where: ``("escape", k)`` or
    ``("call", j)``, positions in ``vias`` and ``calls``. The rest of the forward would
    run the other branch, which decides nothing more (see ``replay/completeness.py``).

    With ``fingerprints``, ``prints`` holds, per call in ``calls``, the
    :func:`fingerprint` of each tensor it returned (None for a call whose outputs the
    capture records its own way): what tells an intermediate that moved, where the
    outputs did not.
    """

    def __init__(
        self,
        plan: Callable[[int, Any], Any],
        expected: PerturbingMode | None = None,
        fingerprints: bool = False,
    ) -> None:
        super().__init__()
        self.plan = plan
        self.expected = expected
        self.prints: list[list[tuple | None] | None] | None = [] if fingerprints else None
        self.vias: list[str] = []
        self.calls: list[str] = []  # the calls the capture would record, by name
        self.at: list[int] = []  # per escape call, how many of those ran before it
        self.flipped = False  # whether a bool escape got a perturbed value
        self.diverged: tuple[str, int] | None = None
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
        if info.settles:  # (a collective in flight: see special.SETTLES)
            SETTLES[func](result)
        if (not self.vias and info.escape is None) or self.diverged is not None:
            return result  # (before the first escape: nothing to note)
        if functorch_level() != self._level:
            return result
        if self.vias and not info.never_tensor and _makes_tensors(info.name, result):
            self.calls.append(info.name)
            if self.prints is not None:
                self.prints.append(_prints(info.name, result))
            if self.expected is not None:
                self._check(self.expected.calls, self.calls, "call")
        if info.escape is None:
            return result
        if not any(isinstance(a, torch.Tensor) for a in (*args, *kwargs.values())):
            return result
        self.vias.append(info.escape)
        self.at.append(len(self.calls))
        if self.expected is not None:
            self._check(self.expected.vias, self.vias, "escape")
        value = self.plan(len(self.vias) - 1, result)
        if isinstance(result, bool) and value is not result:
            self.flipped = True
        return value

    def _check(self, expected: list[str], seen: list[str], kind: str) -> None:
        """Stop the forward if the last of ``seen`` is not what ``expected`` ran there and
        a perturbed value can be why: any, before another escape call; a bool, before
        another op (an int or float changes shapes and values, not which ops run, until
        a branch reads it: the arm's captured forward sorts those out)."""
        k = len(seen) - 1
        if k < len(expected) and expected[k] == seen[k]:
            return
        if kind == "escape" and not getattr(self.plan, "moved", True):
            self.expected = None  # (a path the unperturbed forward did not take, unprompted)
            return
        if kind == "call" and not self.flipped:
            self.expected = None  # (from here the two paths are not aligned to compare)
            return
        self.diverged = (kind, k)
        raise Diverged(f"the forward left the unperturbed path at {kind} {k}: {seen[k]}")
