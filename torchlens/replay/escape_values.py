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
import time
import warnings
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

from torchlens.capture import (
    FUNC_INFOS,
    SETTLES,
    SPECIAL_OUTPUTS,
    func_info,
    functorch_level,
    opened_body,
)
from torchlens.errors import PayloadUnavailableError
from torchlens.replay.exemptions import MAY_BE_UNINITIALIZED

__all__ = [
    "UNCHANGED",
    "perturbed",
    "Budget",
    "OverBudget",
    "Plan",
    "PerturbingMode",
    "Diverged",
    "recorded_calls",
    "recorded_groups",
    "fingerprint",
    "saved_fingerprint",
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


def perturbed_down(value: Any) -> Any:
    """``value`` moved the other way from :func:`perturbed` (a float down where that one
    moves it up, an int up where that one moves it down, an int 0 left alone: -1 is often
    no valid size or index), so a threshold equal to an escaped value (``x > x.min()
    .item()``) is crossed one way or the other; :data:`UNCHANGED` where there is no other
    way (a bool, which flips)."""
    if isinstance(value, bool):
        return UNCHANGED
    if isinstance(value, int):
        return value + 1 if value > 0 else (value - 1 if value < 0 else UNCHANGED)
    if isinstance(value, (float, complex)):
        if isinstance(value, float) and not math.isfinite(value):
            return UNCHANGED
        return value - (abs(value) * _RELATIVE + _ABSOLUTE)
    if isinstance(value, list):
        items = [perturbed_down(v) for v in value]
        if all(item is UNCHANGED for item in items):
            return UNCHANGED
        if all(type(v) is int for v in value) and len(value) > 1:
            return UNCHANGED  # (sizes: the one move that keeps their sum was made)
        return [v if item is UNCHANGED else item for v, item in zip(value, items)]
    if isinstance(value, np.ndarray):
        if np.issubdtype(value.dtype, np.inexact):
            return (value - (np.abs(value) * _RELATIVE + _ABSOLUTE)).astype(value.dtype)
        if np.issubdtype(value.dtype, np.integer) and value.dtype != np.bool_:
            return value + np.sign(value).astype(value.dtype)
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


class OverBudget(BaseException):
    """Raised inside one of the completeness arm's forwards when it ran past its
    :class:`Budget` (a perturbed value made a loop run longer, or forever: ``while True:
    ...; if float(err) == 0.0: break``). A ``BaseException``, so a model's ``except
    Exception`` lets it through; ``call`` is the escape call it was raised at (or the
    number of escape calls made, when it was raised at an op)."""

    def __init__(self, what: str, call: int) -> None:
        super().__init__(what)
        self.what, self.call = what, call


@dataclass
class Budget:
    """What one of the arm's forwards may spend, a small multiple of the ground-truth run:
    torch calls from its first escape on (``ops``; before it nothing is perturbed) and
    escape calls (``escapes``) of a plain forward, and wall-clock
    ``seconds`` for a plain forward under a mode (``light``) and for a captured one."""

    ops: int
    escapes: int
    light: float
    captured: float

    TIMES = 4  # the multiple of the ground-truth run's calls and time
    SLACK_OPS, SLACK_ESCAPES, SLACK_SECONDS = 1_000, 64, 2.0

    @classmethod
    def of(cls, ops: int, escapes: int, seconds: float) -> Budget:
        """The budget for forwards of a model whose ground-truth run made ``ops`` torch
        calls and ``escapes`` escape calls in ``seconds``."""
        light = cls.TIMES * 2 * seconds + cls.SLACK_SECONDS  # (a mode's Python call per op)
        return cls(
            cls.TIMES * ops + cls.SLACK_OPS, cls.TIMES * escapes + cls.SLACK_ESCAPES,
            light, light,
        )  # fmt: skip

    def timed_capture(self, seconds: float, escapes: int = 0) -> None:
        """Captured forwards may take a small multiple of the capture's ``seconds`` (and of
        its ``escapes`` calls, where the ground-truth run did not count them)."""
        self.captured = max(self.captured, self.TIMES * seconds + self.SLACK_SECONDS)
        self.escapes = max(self.escapes, self.TIMES * escapes + self.SLACK_ESCAPES)


class Plan:
    """Which escape calls get perturbed values: ``calls`` (escape call numbers, or None
    for all); the others give their own. Called as an escape hook, ``plan(call, value)``.
    ``direction`` is 1 for :func:`perturbed`'s move, -1 for the other way
    (:func:`perturbed_down`). With a :class:`Budget` (see :meth:`start`), an escape call
    past it, in number or time, raises :class:`OverBudget`."""

    def __init__(self, calls: Collection[int] | None, direction: int = 1) -> None:
        self.calls = None if calls is None else frozenset(calls)  # None: every call
        self.moved: set[int] = set()  # the calls whose values it changed
        self.downs: set[int] = set()  # of those, the ones perturbed_down moves too
        self.direction = direction
        self.escapes = self.ops = 1 << 62  # escape calls, and calls from the first on, allowed
        self.deadline = math.inf

    def start(self, budget: Budget | None, captured: bool) -> Plan:
        """Arm the budget for one forward starting now; returns the plan."""
        if budget is not None:
            self.escapes, self.ops = budget.escapes, budget.ops
            seconds = budget.captured if captured else budget.light
            self.deadline = time.perf_counter() + seconds
        return self

    def check(self, call: int) -> None:
        """Raise :class:`OverBudget` when the forward is past its budget at escape ``call``."""
        if call >= self.escapes:
            raise OverBudget(f"{call + 1} escape calls, its budget {self.escapes}", call)
        if time.perf_counter() > self.deadline:
            raise OverBudget("its time budget", call)

    def __call__(self, call: int, value: Any) -> Any:
        self.check(call)
        if self.calls is not None and call not in self.calls:
            return value
        new = perturbed(value) if self.direction > 0 else perturbed_down(value)
        if new is UNCHANGED:
            return value
        self.moved.add(call)
        if self.direction > 0 and perturbed_down(value) is not UNCHANGED:  # (never a bool)
            self.downs.add(call)
        return new


def _makes_tensors(name: str, result: Any) -> bool:
    """Whether the capture would record the call (it produced a tensor)."""
    if isinstance(result, torch.Tensor) or name in SPECIAL_OUTPUTS:
        return True
    return isinstance(result, (tuple, list)) and any(isinstance(r, torch.Tensor) for r in result)


def recorded_groups(trace: Any, from_start: bool = False) -> list[list[Any]]:
    """The ops a trace recorded from its first escape on (or, ``from_start``, from its
    first op), one list per function call (its outputs, in order): what
    :class:`PerturbingMode` sees as one call each."""
    groups: list[list[Any]] = []
    last = None
    start = 0 if from_start else trace.escapes[0].index if trace.escapes else len(trace.ops)
    for op in trace.ops[start:]:
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


def saved_fingerprint(op: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The :func:`fingerprint` of ``op``'s saved value, or None when it is not compared
    (uninitialised memory, which differs run to run; a value not saved)."""
    if op.func_name in MAY_BE_UNINITIALIZED:
        return None
    try:
        return fingerprint(op.out)
    except PayloadUnavailableError:
        return None


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


_WATCHED_ITEMS = 256  # a list escape longer than this counts as taken by torch (not watched)
_COARSE = 1024  # a float that many times over is whole is on a grid Python constants share


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

    With ``from_start``, ``calls`` (and ``prints``) start at the forward's first call.

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
        from_start: bool = False,
    ) -> None:
        super().__init__()
        self.from_start = from_start  # note calls from the first, not the first escape on
        self.plan = plan
        self.expected = expected
        self.prints: list[list[tuple | None] | None] | None = [] if fingerprints else None
        self.vias: list[str] = []
        self.calls: list[str] = []  # the calls the capture would record, by name
        self.at: list[int] = []  # per escape call, how many of those ran before it
        self.flipped = False  # whether a bool escape got a perturbed value
        self.diverged: tuple[str, int] | None = None
        self._max_ops = getattr(plan, "ops", 1 << 62)
        self._deadline = getattr(plan, "deadline", math.inf)
        self._level = functorch_level()
        # a ParamGuard whose state copies a parameter before a call writes it (not pushed:
        # this mode asks it first)
        self.guard: Any = None
        # numbers the plan moved, until a later torch call takes them as an argument:
        # value -> escape calls; those taken are in ``reentered`` (see _track)
        self._numbers: dict[Any, list[int]] = {}
        self.reentered: set[int] = set()

    def _over(self, calls: int) -> None:
        """Raise :class:`OverBudget` past the plan's calls (``calls``, those noted from the
        first escape on: before it nothing is perturbed) or, looked at every 64 calls, its
        time."""
        if calls > self._max_ops:
            raise OverBudget(f"{calls} torch calls, its budget {self._max_ops}", len(self.vias))
        if not calls & 63 and time.perf_counter() > self._deadline:
            raise OverBudget("its time budget", len(self.vias))

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.guard is not None and self.guard.writes(func):
            self.guard.before(func, args, kwargs)
        if self._numbers:
            self._taken(args, kwargs)
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
        if info.escape is None:
            result = func(*args, **kwargs)
        else:  # torch's warning of a read (a scalar of a tensor with grad) would name this
            with warnings.catch_warnings():  # line, torchlens's own, not the model's
                warnings.simplefilter("ignore")
                result = func(*args, **kwargs)
        if info.settles:  # (a collective in flight: see special.SETTLES)
            SETTLES[func](result)
        noting = bool(self.vias) or self.from_start
        if (not noting and info.escape is None) or self.diverged is not None:
            return result  # (before the first escape: nothing to note)
        if functorch_level() != self._level:
            return result
        if noting and not info.never_tensor and _makes_tensors(info.name, result):
            self.calls.append(info.name)
            calls = len(self.calls)
            if calls > self._max_ops or not calls & 63:
                self._over(calls)
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
        elif value is not result:
            self._track(len(self.vias) - 1, value, result)
        return value

    def _track(self, call: int, value: Any, was: Any) -> None:
        """Watch for ``value`` (escape ``call``'s moved number; ``was``, its own) coming
        back into a torch call as an argument: a threshold (``x > t``), a size, an index.
        Those are probed the other way too, and so is any number Python may compare with
        a constant equal to it: an int (a count against a limit, ``if n <= limit:``,
        crosses it one way only) and a float on a coarse binary grid (``assert y.min()
        .item() >= 0.0``, ``if p > 0.5:``: such constants are likely that number). Only
        a float of fine grain that Python alone reads is not (see
        ``replay/completeness.py``). What cannot be watched by value (an array, a long
        list) counts as taken."""
        if type(was) is int or (
            type(was) is float and math.isfinite(was) and (was * _COARSE).is_integer()
        ):
            self.reentered.add(call)
            return
        numbers = value if isinstance(value, list) else [value]
        if isinstance(value, list) and len(value) <= _WATCHED_ITEMS:
            numbers = [v for item in value for v in (item if isinstance(item, list) else [item])]
        if len(numbers) > _WATCHED_ITEMS or not all(type(v) in (int, float) for v in numbers):
            self.reentered.add(call)
            return
        for number in numbers:
            self._numbers.setdefault(number, []).append(call)

    def _taken(self, args: tuple, kwargs: dict) -> None:
        """Note the watched numbers among a call's arguments (and inside its tuples,
        lists and slices: ``x[:, :n]``, ``x.new_zeros((n, 4))``)."""
        for arg in (*args, *kwargs.values()) if kwargs else args:
            kind = type(arg)
            if kind is int or kind is float:
                self._take(arg)
            elif kind is tuple or kind is list or kind is slice or kind is torch.Size:
                for item in (arg.start, arg.stop, arg.step) if kind is slice else arg:
                    if type(item) is slice:
                        self._take(item.start)
                        self._take(item.stop)
                        self._take(item.step)
                    else:
                        self._take(item)

    def _take(self, value: Any) -> None:
        if type(value) is int or type(value) is float:
            found = self._numbers.pop(value, None)
            if found is not None:
                self.reentered.update(found)

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
