"""Floors: the least pure Python any capture of the same facts pays, measured beside it.

Each floor is a function mode stripped to what a recorder of its kind cannot skip, so a
benchmark can print how far ``tl.trace`` and ``tl.record`` are above the cost of the facts
they keep, on the same machine and in the same run as the plain forward:

* :func:`graph_floor`: every call's tensor parents found by identity, one tuple per call,
  every output kept, and the module stack followed by wrapping each submodule's
  ``forward`` (as ``capture/hooks.py`` does). No labels, no sources, no versions, no
  payload bookkeeping: the least a capture with edges and module calls runs per op.
* :func:`count_floor`: every call counted by function, and the module stack followed the
  same way: the least a recorder that names ops and module calls (as ``tl.record`` must,
  so that labels and ``tl.module`` selectors mean what they mean in a trace) runs per op.

Neither is a faithful capture (no in-place writes, no nested arguments, no keywords):
they undercount, which is what a floor should do.

* :func:`replay_floor`: every recorded call of a trace rerun once from its saved parent
  values and each output compared with its saved value (a byte compare where the value is
  bit for bit the same), as the replay arm runs and compares them: the least a per-op
  replay check runs, with no perturbation and no findings.
* :func:`check_floor`: the replay floor, and in the same pass every edge the perturbation
  arm can only prove with a call (not exempt by its table or argument kind, the output not
  the parent's own memory, the parent not shown by a refresh's recorded writes: the arm's
  own rules) probed once, at the first point the arm probes it (a sliced point where the
  arm's cut rules allow one, else the recorded call), as the arm probes it. The least an
  arm that proves each edge by moving its parent runs: no second probe, no findings.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from torchlens.replay.edges import _Points, _Trial
from torchlens.replay.exemptions import MAY_BE_UNINITIALIZED, value_exempt
from torchlens.replay.interpreter import Checker
from torchlens.replay.memory import surviving_parents
from torchlens.replay.tolerances import mismatch

__all__ = ["check_floor", "count_floor", "graph_floor", "replay_floor"]

Tensor = torch.Tensor
_TENSOR_TYPES = (Tensor, nn.Parameter)


class _FramesMode(TorchFunctionMode):
    """A mode that knows the open module calls as ``(module id, call number)`` frames."""

    def __init__(self) -> None:
        super().__init__()
        self.frames: tuple[tuple[int, int], ...] = ()
        self.calls: dict[int, int] = {}


class _GraphFloor(_FramesMode):
    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, tuple[Tensor, int]] = {}  # id -> (tensor, its call's index)
        self.ops: list[tuple] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **kwargs) if kwargs else func(*args)
        live = self.live
        parents = []
        for arg in args:
            if type(arg) in _TENSOR_TYPES:
                entry = live.get(id(arg))
                parents.append(entry[1] if entry is not None and entry[0] is arg else -1)
        index = len(self.ops)
        self.ops.append((func, parents, self.frames, out))
        if type(out) is Tensor:
            live[id(out)] = (out, index)
        return out


class _CountFloor(_FramesMode):
    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[Any, int] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **kwargs) if kwargs else func(*args)
        counts = self.counts
        counts[func] = counts.get(func, 0) + 1
        return out


@contextmanager
def _frames_followed(model: nn.Module, mode: _FramesMode) -> Iterator[None]:
    """Each submodule's ``forward`` wrapped to push and pop its frame on ``mode``."""

    def wrapped(module: nn.Module, forward: Callable[..., Any]) -> Callable[..., Any]:
        key = id(module)

        def forward_followed(*args: Any, **kwargs: Any) -> Any:
            before = mode.frames
            call = mode.calls[key] = mode.calls.get(key, 0) + 1
            mode.frames = (*before, (key, call))
            try:
                return forward(*args, **kwargs)
            finally:
                mode.frames = before

        return forward_followed

    modules = list(model.modules())
    before = [module.__dict__.get("forward") for module in modules]  # instance forwards
    for module in modules:
        module.__dict__["forward"] = wrapped(module, module.forward)
    try:
        with mode:
            yield
    finally:
        for module, forward in zip(modules, before):
            if forward is None:
                del module.__dict__["forward"]
            else:
                module.__dict__["forward"] = forward


def graph_floor(model: nn.Module, args: tuple, run: Callable[[], Any] | None = None) -> Any:
    """Run ``model(*args)`` (or ``run()``) under the graph floor; returns its output."""
    with _frames_followed(model, _GraphFloor()):
        return run() if run is not None else model(*args)


def count_floor(model: nn.Module, args: tuple, run: Callable[[], Any] | None = None) -> Any:
    """Run ``model(*args)`` (or ``run()``) under the counting floor; returns its output."""
    with _frames_followed(model, _CountFloor()):
        return run() if run is not None else model(*args)


def replay_floor(trace: Any) -> list[str]:
    """Replay every recorded call of ``trace`` once and compare (see the module docstring);
    returns the labels whose output did not match its saved value (none for a faithful
    trace of a deterministic forward)."""
    floor = _ReplayFloor(trace)
    with torch.no_grad():
        floor.run()
    return floor.differ


def check_floor(trace: Any) -> tuple[list[str], int]:
    """The replay floor with each edge that needs a call probed once (see the module
    docstring); returns the labels the replay found differing and how many probed edges
    did not move (both empty or zero for a faithful trace whose edges all move at once)."""
    floor = _ReplayFloor(trace, probe=True)
    with torch.no_grad():
        floor.run()
    return floor.differ, floor.unmoved


class _ReplayFloor(Checker):
    """The replay arm's own calls (:meth:`Checker.run_call`: arguments that a call may write
    into are copied first, stochastic calls get their RNG snapshot, ``linear``, ``matmul``
    and attention the recorded ``requires_grad`` flags that pick the forward's kernel) and
    its comparison (none of values that may be uninitialised memory), without findings or
    (unless ``probe``) the perturbation arm. A refresh the store keeps as its writes is
    made once, as the arm makes it (``replay/written_over.py``)."""

    def __init__(self, trace: Any, probe: bool = False) -> None:
        super().__init__(trace, findings=None, atol=None, rtol=None)
        self.differ: list[str] = []
        self.probe, self.unmoved = probe, 0
        self._later: list[tuple[Any, Any, list[list[int]]]] = []  # calls with a sliced point

    def visit(self, ops: list[Any]) -> None:
        head = ops[0]
        recipe = self._made.recipe(head) if head.func_name == "refresh" else None
        if recipe is not None:  # a refresh kept as its writes: made once, as the arm does
            value, values = self._made.value(head, recipe)
            if self.probe:
                self._probe(head, values, [value])
            return
        values = self.parent_values(head)
        outputs = self.run_call(head, values)
        for op in ops:
            if op.output_index >= len(outputs):
                self.differ.append(op.label)
                continue
            actual = outputs[op.output_index]
            if op.func_name in MAY_BE_UNINITIALIZED and value_exempt(op, values, actual):
                continue  # uninitialised memory: the arm compares its shape and dtype only
            if mismatch(actual, op.out):
                self.differ.append(op.label)
        if self.probe:
            self._probe(head, values, outputs)

    def run(self) -> None:
        super().run()
        for head, points, pending in self._later:  # (as the arm defers them: see edges.py)
            self._settle(head, points, pending)
        self._later.clear()

    def _probe(self, head: Any, values: list[Tensor], outputs: list[Tensor]) -> None:
        """Probe once, at the arm's first point, each edge of the call the arm proves with
        a call; a call with a sliced point later, after the whole replay, as the arm does."""
        edges = self.edges
        shown = surviving_parents(head, self.trace) if head.func_name == "refresh" else ()
        slots: dict[str, list[int]] = {}
        for i, ref in enumerate(head.parent_args):
            slots.setdefault(ref[0], []).append(i)
        pending = [
            indices
            for label, indices in slots.items()
            if label not in shown
            and not edges._without_calls(head, label, indices, values, outputs, None)
        ]
        if not pending:
            return
        points = _Points(edges, head, values, outputs)
        if points.sliceable:
            self._later.append((head, points, pending))
        else:
            self._settle(head, points, pending)

    def _settle(self, head: Any, points: Any, pending: list[list[int]]) -> None:
        for indices in pending:
            for point_values, baselines, recorded in points:
                trial = _Trial(indices)
                if not self.edges._effect(
                    head, point_values, indices, "noise", baselines, trial, recorded
                ):
                    self.unmoved += 1
                break
