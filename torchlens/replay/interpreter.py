"""Replay as an interpreter over a trace, in the manner of ``torch.fx.Interpreter``.

:class:`Interpreter` walks the trace one recorded call at a time (the outputs of a
multi-output call are replayed together) and re-executes a call from values it is handed,
with one method per kind of op: ordinary calls, stochastic calls (the op's RNG snapshot is
restored around them) and ``refresh`` ops (a write through another view, redone from the
writer's recorded geometry). :class:`Checker` is the small variation that validation runs:
per-op replay from saved parent values, then perturbation of each tensor parent.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from torchlens.capture import rng
from torchlens.capture.controls import reapply
from torchlens.capture.special import SPECIAL_OUTPUTS
from torchlens.capture.tree import fill, flatten
from torchlens.errors import PayloadUnavailableError
from torchlens.replay.exemptions import (
    MAY_NOT_CHANGE,
    MUTATES_ARGUMENTS,
    VALUE_EXEMPT,
    exempt_reason,
    parent_kind_reason,
)
from torchlens.replay.perturb import Perturber, same_elements, sliced
from torchlens.replay.tolerances import Reference, mismatch

__all__ = ["Interpreter", "Checker", "Unreplayable", "calls"]

Tensor = torch.Tensor


class Unreplayable(Exception):
    """A recorded call that cannot be re-executed (no function, no geometry...)."""


def calls(trace: Any) -> Iterator[list[Any]]:
    """The trace's ops grouped by the function call that produced them, in order."""
    group: list[Any] = []
    for op in trace.ops:
        if group and op.call_index != group[0].call_index:
            yield group
            group = []
        group.append(op)
    if group:
        yield group


class Interpreter:
    """Re-executes recorded calls. Subclasses override :meth:`visit`."""

    def __init__(self, trace: Any) -> None:
        self.trace = trace

    def run(self) -> None:
        """Visit every recorded call in execution order."""
        for ops in calls(self.trace):
            self.visit(ops)

    def visit(self, ops: list[Any]) -> None:
        raise NotImplementedError

    def parent_values(self, op: Any) -> list[Tensor]:
        """Saved values of the op's tensor arguments, slot order; raises if one is missing."""
        return [self.trace[ref.label].out for ref in op.parent_args]

    def execute(self, op: Any, values: list[Tensor]) -> list[Tensor]:
        """Run the call that produced ``op`` on ``values``; returns all its output tensors."""
        if op.func is None:
            if op.func_name == "refresh":
                return self.execute_refresh(op, values)
            raise Unreplayable(f"no function was recorded for {op.func_name!r}")
        if op.rng_state is not None:
            return self.execute_stochastic(op, values)
        return self.execute_call(op, values)

    def execute_call(self, op: Any, values: list[Tensor]) -> list[Tensor]:
        args = fill(op.args_template, values)
        kwargs = fill(op.kwargs_template, values)
        result = op.func(*args, **kwargs)
        special = SPECIAL_OUTPUTS.get(op.func_name)
        outputs = special(args, result) if special else flatten(result)[0]
        return [tensor for _, tensor in outputs]

    def execute_stochastic(self, op: Any, values: list[Tensor]) -> list[Tensor]:
        with rng.restored(op.rng_state):
            return self.execute_call(op, values)

    def execute_refresh(self, op: Any, values: list[Tensor]) -> list[Tensor]:
        """Redo a write made through another view: the stale value, then the writer's."""
        if len(op.parent_args) != 2:
            raise Unreplayable("the tensor changed without a recorded writer")
        writer = self.trace[op.parent_args[1].label]
        base, region = op.meta.get("geometry"), writer.meta.get("geometry")
        if base is None or region is None:
            raise Unreplayable("no storage geometry was recorded for this write")
        stale, written = values
        if stale.dtype != written.dtype:
            raise Unreplayable("the write reinterpreted the storage as another dtype")
        return [write_through(stale, written, base, region)]


def write_through(stale: Tensor, written: Tensor, base: tuple, region: tuple) -> Tensor:
    """``stale`` laid out in a scratch storage, ``written`` copied over its region, read back.

    ``base`` and ``region`` are ``(shape, stride, storage_offset)`` in the shared storage.
    """
    start = min(base[2], region[2])
    extent = max(_end(base), _end(region)) - start
    scratch = stale.new_zeros(max(extent, 0))
    view = scratch.as_strided(base[0], base[1], base[2] - start)
    view.copy_(stale)
    scratch.as_strided(region[0], region[1], region[2] - start).copy_(written)
    return view.clone()


def _end(geometry: tuple) -> int:
    shape, stride, offset = geometry
    if any(size == 0 for size in shape):
        return offset
    return offset + sum((size - 1) * step for size, step in zip(shape, stride)) + 1


class Checker(Interpreter):
    """Per-op replay and perturbation of every call, findings written to a ``Findings``."""

    def __init__(self, trace: Any, findings: Any, atol: float | None, rtol: float | None):
        super().__init__(trace)
        self.findings = findings
        self.atol, self.rtol = atol, rtol
        self.perturber = Perturber()
        self._uncut_weights: set[str] = set()  # functions that refused cut weights

    def run(self) -> None:
        """Check every call; the caller's RNG state is put back once, at the end."""
        with rng.restored(rng.snapshot()):
            super().run()

    def execute_stochastic(self, op: Any, values: list[Tensor]) -> list[Tensor]:
        rng.restore(op.rng_state)  # no need to save the state between calls: see run()
        return self.execute_call(op, values)

    def visit(self, ops: list[Any]) -> None:
        head, record = ops[0], self.findings
        try:
            values = self.parent_values(head)
            baseline = self.execute(head, self._guarded(head, values))
            edited = reapply(self.trace, ops, baseline)  # intervene= edits, as captured
        except (PayloadUnavailableError, Unreplayable) as err:
            for op in ops:
                record.unchecked(op.label, "replay", f"could not replay: {err}")
                record.unchecked(op.label, "perturbation", "needs a replayable call")
            return
        except Exception as err:  # the recorded call does not run on its recorded inputs
            for op in ops:
                record.fail(op.label, "replay", f"replaying raised {type(err).__name__}: {err}")
            return
        for op in ops:
            self._compare(op, edited)
        self._perturb_all(ops, head, values, baseline)

    # -- arm 2: per-op replay -------------------------------------------------------------
    def _compare(self, op: Any, outputs: list[Tensor]) -> None:
        if op.output_index >= len(outputs):
            self.findings.fail(op.label, "replay", f"the call gave {len(outputs)} outputs")
            return
        actual = outputs[op.output_index]
        if op.func_name in VALUE_EXEMPT:
            problem = mismatch(actual, actual.new_zeros(op.shape), 0.0, 0.0)
            problem = problem if problem and "values" not in problem else None
        else:
            try:
                expected = op.out
            except PayloadUnavailableError as err:
                self.findings.unchecked(op.label, "replay", f"no saved value: {err}")
                return
            problem = mismatch(actual, expected, self.atol, self.rtol)
        if problem:
            self.findings.fail(op.label, "replay", problem)
        else:
            self.findings.replayed(op.label)

    # -- arm 3: perturbation --------------------------------------------------------------
    def _perturb_all(self, ops: list[Any], head: Any, values: list[Tensor], baseline) -> None:
        slots: dict[str, list[int]] = {}
        for i, ref in enumerate(head.parent_args):
            slots.setdefault(ref.label, []).append(i)
        points = _Points(self, head, values, baseline)
        verdicts = [self._perturb_one(head, label, idx, points) for label, idx in slots.items()]
        for op in ops:
            self.findings.perturbed(op.label, verdicts)

    def _perturb_one(self, head, label, indices, points) -> tuple[str, str]:
        """``(verdict, reason)`` for one parent: verified, exempt, failed or unchecked.

        At each point (cheap sliced ones first when there are any, then the recorded one) the
        parent is moved by noise, halved, then negated. If nothing changes the output, the
        other floating arguments are moved too: an edge can be real yet annihilated by
        another argument's value (a zero weight, a zero initial hidden state).
        """
        values = points.values
        positions = [head.parent_args[i].position for i in indices]
        reason = parent_kind_reason(values[indices[0]]) or exempt_reason(head, positions)
        if reason:
            return "exempt", f"{label}: {reason}"
        if all(out.numel() == 0 for out in points.outputs):
            return "exempt", f"{label}: the output has zero elements"
        if any(same_elements(out, values[indices[0]]) for out in points.outputs):
            return "verified", label  # the output is the parent's memory, reordered at most
        errors: list[str] = []
        for point_values, point_baseline in points:
            for attempt in range(3):
                if self._effect(head, point_values, indices, attempt, point_baseline, errors):
                    return "verified", label
        elsewhere = self.perturber.others(values, set(indices))
        if elsewhere is not None:
            try:
                moved = self.references(self.execute(head, self._guarded(head, elsewhere)))
                if self._effect(head, elsewhere, indices, 0, moved, errors):
                    return "verified", label
            except Exception as err:  # noqa: BLE001 - a point where the call is invalid
                errors.append(f"{type(err).__name__}: {err}")
        if head.func_name in MAY_NOT_CHANGE:
            return "exempt", f"{label}: output unchanged; {MAY_NOT_CHANGE[head.func_name]}"
        if errors:
            return "unchecked", f"perturbing {label!r} made the call raise {errors[-1]}"
        return "failed", f"output did not change when parent {label!r} was perturbed"

    def _effect(self, head, values, indices, attempt, baseline, errors: list[str]) -> bool:
        """Whether replacing the parent at ``indices`` changes the call's outputs
        (``baseline``: :class:`Reference` s to the unchanged outputs)."""
        changed = list(values)
        bumped = self.perturber.moved(values[indices[0]], attempt)
        for i in indices:
            changed[i] = bumped
        try:
            outputs = self.execute(head, self._guarded(head, changed, skip=set(indices)))
        except Exception as err:  # noqa: BLE001 - the perturbed value is outside the domain
            errors.append(f"{type(err).__name__}: {err}")
            return False
        if len(outputs) != len(baseline):
            return True
        return any(ref.differs(out) for out, ref in zip(outputs, baseline))

    def references(self, outputs: list[Tensor]) -> list[Reference]:
        """What perturbed outputs are compared with, under this check's tolerances."""
        return [Reference(out, self.atol, self.rtol) for out in outputs]

    def small_point(
        self, head, values, baseline, dims: int, weights: bool
    ) -> tuple[list, list] | None:
        """The call at the first entry of ``dims`` leading batch-like dimensions (and of its
        weights), when that runs (see :func:`~torchlens.replay.perturb.sliced`)."""
        if weights and head.func_name in self._uncut_weights:
            return None
        kinds = [getattr(self.trace[ref.label], "kind", "op") for ref in head.parent_args]
        small = sliced(values, kinds, baseline, dims, weights)
        if small is None:
            return None
        try:
            return small, self.references(self.execute(head, self._guarded(head, small)))
        except Exception:  # noqa: BLE001 - the call is not separable this way
            if weights:  # e.g. layer_norm: its weight's shape is fixed; do not try again
                self._uncut_weights.add(head.func_name)
            return None

    @staticmethod
    def _guarded(op: Any, values: list[Tensor], skip: set[int] = frozenset()) -> list[Tensor]:
        """Copies of the values a call may write into, so saved values stay as saved."""
        if op.is_inplace or op.func_name in MUTATES_ARGUMENTS or op.func is None:
            return [v if i in skip else v.clone() for i, v in enumerate(values)]
        return values


class _Points:
    """Where to perturb a call: one position of its batch-like arguments with its weights
    cut to one entry, then without cutting the weights, then one row, then the recorded
    point. Each sliced point is computed the first time a parent needs it, so a call
    whose edges the smallest point proves pays for nothing larger."""

    def __init__(self, checker: Checker, head: Any, values: list[Tensor], baseline) -> None:
        self.values, self.outputs = values, baseline
        self._checker, self._head = checker, head
        self._pending = [(2, True), (2, False), (1, False)] if head.func is not None else []
        self._ready: list[tuple[list, list]] = []
        self._recorded: tuple[list, list] | None = None

    @property
    def recorded(self) -> tuple[list[Tensor], list[Reference]]:
        """The recorded point: its values and references to its outputs (made on first use,
        since most edges are proved at a sliced point)."""
        if self._recorded is None:
            self._recorded = (self.values, self._checker.references(self.outputs))
        return self._recorded

    def __iter__(self):
        index = 0
        while True:
            while index >= len(self._ready) and self._pending:
                dims, weights = self._pending.pop(0)
                point = self._checker.small_point(
                    self._head, self.values, self.outputs, dims, weights
                )
                if point is not None:
                    self._ready.append(point)
            if index >= len(self._ready):
                yield self.recorded
                return
            yield self._ready[index]
            index += 1
