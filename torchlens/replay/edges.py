"""Arm 3, perturbation: prove that every recorded edge is a real dependency.

For each tensor parent of each call, the parent's value is moved and the call rerun; the
output must move (judged on its own scale, see :class:`~torchlens.replay.perturb.Baseline`).
Edges decided without a call come first: exempt kinds and positions, outputs with no
elements, and outputs that are the parent's own memory (a view). The rest are probed at
cheap sliced points (see :class:`_Points`; a sliced call is made only where a rule of
:data:`~torchlens.replay.cut_rules.CUT_RULES` says the kernel accepts it) with the moves of
:data:`~torchlens.replay.perturb.SLICED_PROBES`, which can only *prove* an edge; then, before
any edge may fail, the full recorded call is probed with every move of
:data:`~torchlens.replay.perturb.BATTERY` (noise, halving, shift, NaN, sign flip, zero, a
huge value, a random point, inf), and at neutral points where the other arguments are
replaced by fresh values. An edge no probe shows is *unread* when an argument-level rule
of :mod:`~torchlens.replay.exemptions` says why, and *failed* otherwise.

The checker hands every call over right after replaying it. Calls that have a sliced point
are proved later, after the whole replay: their perturbed calls are tiny and Python-bound,
and run about a third faster together than each squeezed between two full-size calls that
sweep the CPU caches. Only the parent values are kept for them; the recorded point's
outputs are recomputed when a sliced point proves nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

import torch

from torchlens._tensors import inner_of
from torchlens.capture import fill
from torchlens.replay.cut_rules import cut_points
from torchlens.replay.exemptions import (
    ON_META,
    SILENT_OUTPUT,
    exempt_reason,
    maybe_exempt,
    parent_kind_reason,
    proven_by_rule,
    unchanged_reason,
    unread_reason,
)
from torchlens.replay.grad_replay import GRAD_FUNCS, differentiated, graph_edge
from torchlens.replay.memory import part_of, surviving_parents
from torchlens.replay.perturb import (
    BATTERY,
    NEUTRAL_PROBES,
    SLICED_PROBES,
    Baseline,
    Perturber,
    cut,
    large_enough,
    same_elements,
    slice_plan,
)

__all__ = ["EdgeProver", "Runner"]

Tensor = torch.Tensor
Verdict = tuple[str, str]  # (verified | exempt | unread | failed | unchecked, reason or label)

# A grouped convolution (depthwise ones: MobileNet, EfficientNet, ConvNeXt) refuses a cut
# channel and cut weights alike (its groups are fixed), and each refusal costs a raised
# error (70 to 400 microseconds): only one image with whole weights is tried
_CONVOLUTIONS = frozenset({"conv1d", "conv2d", "conv3d"})
_ONE_ROW = ((1, False),)


class Runner(Protocol):
    """What the prover needs from the checker: running a recorded call on given values."""

    trace: Any
    findings: Any
    atol: float | None
    rtol: float | None

    def run_call(
        self, op: Any, values: list[Tensor], skip: set[int] = ..., sliced: bool = ...
    ) -> list[Tensor]: ...


class EdgeProver:
    """Proves the edges of the calls it is handed; verdicts go to the runner's findings."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.perturber = Perturber()
        # ((function, argument shapes), dimensions cut, weights cut) of sliced points that
        # raised: a call of the same function on the same shapes is not cut so again (a
        # layer norm's weight must match its input). Shapes, not only ranks: a 2-d linear
        # refuses only where its features, as many as its outputs, were cut with the rows
        self.refused: set[tuple[tuple[str, tuple], int, bool]] = set()
        self._later: list[tuple[list[Any], dict, list, _Points]] = []

    def prove(self, ops: list[Any], values: list[Tensor], outputs: list[Tensor]) -> None:
        """Prove the edges of one call (its ``ops``), replayed from ``values`` to ``outputs``,
        now or (when it has a sliced point) at :meth:`finish`."""
        head = ops[0]
        slots: dict[str, list[int]] = {}
        for i, ref in enumerate(head.parent_args):
            slots.setdefault(ref[0], []).append(i)
        unmovable = _nothing_to_move(outputs)  # why no probe can move them, or None
        verdicts: dict[str, Verdict | None] = dict.fromkeys(slots)  # in argument order
        pending: list[tuple[str, list[int]]] = []
        # a refresh's parents whose elements survive the writes into its value (memory.py)
        shown = surviving_parents(head, self.runner.trace) if head.func_name == "refresh" else ()
        for label, indices in slots.items():
            if label in shown and not unmovable:
                verdicts[label] = ("verified", label)
                continue
            verdict = self._without_calls(head, label, indices, values, outputs, unmovable)
            if verdict is None:
                pending.append((label, indices))
            else:
                verdicts[label] = verdict
        if not pending:
            self._record(ops, list(verdicts.values()))
            return
        points = _Points(self, head, values, outputs)
        if points.sliceable:
            points.release()
            self._later.append((ops, verdicts, pending, points))
        else:
            self._settle(ops, verdicts, pending, points)

    def finish(self) -> None:
        """Prove the calls kept for later."""
        for job in self._later:
            self._settle(*job)
        self._later.clear()

    def _settle(self, ops, verdicts: dict, pending: list, points: _Points) -> None:
        """Probe the ``pending`` edges, then record every verdict of the call."""
        head = ops[0]
        for label, indices in pending:
            verdicts[label] = self._perturb(head, label, indices, points)
        self._record(ops, list(verdicts.values()))

    def _record(self, ops: list[Any], verdicts: list[Verdict]) -> None:
        for op in ops:
            self.runner.findings.perturbed(op.label, verdicts)

    def _without_calls(self, head, label, indices, values, outputs, unmovable) -> Verdict | None:
        """The verdict when no call is needed: an exemption, nothing in the output to move
        (``unmovable``, the reason), or an output that is the parent's own memory, reordered at
        most."""
        if proven_by_rule(head) is not None:  # (a collective: docs/distributed.md)
            return "verified", label
        parent = values[indices[0]]
        reason = parent_kind_reason(parent)
        if reason is None and maybe_exempt(head, head.parent_args[indices[0]][1]):
            reason = exempt_reason(head, [head.parent_args[i][1] for i in indices])
        if reason or unmovable:
            return "exempt", f"{label}: {reason or unmovable}"
        if head.func in GRAD_FUNCS and label in differentiated(head):  # its graph, not value
            return graph_edge(self.runner, head, label, values)
        for out in outputs:
            if same_elements(out, parent) or part_of(out, parent):
                return "verified", label
        return None

    def _perturb(self, head, label, indices, points: _Points) -> Verdict:
        """Probe the parent at each point: :data:`SLICED_PROBES` at sliced points, which can
        only prove an edge, then every probe of :data:`BATTERY` at the recorded point, then a few
        at neutral points (the other arguments replaced, for an edge silenced by a zero
        weight or a NaN partner). Only then may a rule exempt the edge, or the edge fail."""
        trial = _Trial(indices)
        for point_values, baselines, recorded in points:
            for name in BATTERY if recorded else SLICED_PROBES:
                if self._effect(head, point_values, indices, name, baselines, trial, recorded):
                    return "verified", label
        if points.recorded is None:
            return "unchecked", f"perturbing {label!r}: the recorded call could not be rerun"
        for neutral in self.perturber.neutral_points(points.values, set(indices)):
            try:
                baselines = self.baselines(self.runner.run_call(head, neutral))
            except Exception as err:  # noqa: BLE001 - a point where the call is invalid
                trial.errors.append(f"{type(err).__name__}: {err}")
                continue
            for name in NEUTRAL_PROBES:
                if self._effect(head, neutral, indices, name, baselines, trial, True):
                    return "verified", label
        return self._unproved(head, label, indices, points, trial)

    def _unproved(self, head, label, indices, points: _Points, trial: _Trial) -> Verdict:
        """The verdict for an edge no probe showed: exempt by a rule, else failed (or
        unchecked when every probed call raised)."""
        positions = [head.parent_args[i].position for i in indices]
        _, baselines = points.recorded
        if baselines and all(b.silent for b in baselines):
            return "unread", f"{label}: {SILENT_OUTPUT}"
        args = fill(head.args_template, points.values)
        kwargs = fill(head.kwargs_template, points.values)
        reason = unread_reason(head, positions, args, kwargs) or unchanged_reason(head, positions)
        if reason:
            return "unread", f"{label}: output unchanged under every probe; {reason}"
        if head.func in GRAD_FUNCS and trial.ran:  # a gradient constant in the input: its graph
            return graph_edge(self.runner, head, label, points.values)
        if not trial.ran:
            return "unchecked", f"perturbing {label!r} made the call raise {trial.errors[-1]}"
        return "failed", (
            f"output did not change when parent {label!r} was perturbed (probes: "
            f"{', '.join(BATTERY)}, and at neutral points of the other arguments)"
        )

    def _effect(self, head, values, indices, name, baselines, trial, full: bool) -> bool:
        """Whether the probe ``name`` of the parent at ``indices`` moves the call's outputs
        from ``baselines``. ``full``: a full-size point, whose clean runs count in ``trial``."""
        changed = list(values)
        try:  # a sparse value cannot be moved: the probe raises, as an outside domain does
            bumped = self.perturber.probe(values[indices[0]], name)
            for i in indices:
                changed[i] = bumped
            outputs = self.runner.run_call(head, changed, skip=trial.skip, sliced=not full)
        except Exception as err:  # noqa: BLE001 - the probed value is outside the domain
            trial.errors.append(f"{type(err).__name__}: {err}")
            return False
        trial.ran = trial.ran or full
        if len(outputs) != len(baselines):
            return True
        return any(base.moved(out) for out, base in zip(outputs, baselines))

    def baselines(self, outputs: list[Tensor]) -> list[Baseline]:
        """What probed outputs are compared with (see :class:`Baseline`)."""
        return [Baseline(out) for out in outputs]


def _nothing_to_move(outputs: list[Tensor]) -> str | None:
    """Why no probe can move a call's outputs (asked once per call, not per edge): they
    have no elements, or hold no values (the meta device); None when they can move."""
    if not any(map(Tensor.numel, outputs)):
        return "the output has zero elements"
    for out in outputs:
        if out.is_meta:
            return ON_META
    return None


def _grouped(values: list[Tensor]) -> bool:
    """Whether a convolution's weight reads a part of its batched input's channels only
    (weight ``(out, in / groups, *kernel)`` beside input ``(batch, in, *size)``)."""
    if len(values) < 2:
        return False
    data, weight = values[0], values[1]
    return data.dim() == weight.dim() >= 3 and data.shape[1] != weight.shape[1]


class _Trial:
    """What the probes of one edge met: errors, and whether any full-size call ran."""

    __slots__ = ("errors", "ran", "skip")

    def __init__(self, indices: list[int]) -> None:
        self.errors: list[str] = []
        self.ran = False
        self.skip = frozenset(indices)  # the probed slots: fresh values, not copied again


class _Points:
    """Where to perturb a call: the sliced points its cut rule allows that exist, then the
    recorded point. A sliced point's outputs are computed the first time a parent needs
    them, so a call whose edges the smallest point proves pays for nothing larger."""

    def __init__(
        self, prover: EdgeProver, head: Any, values: list[Tensor], outputs: list[Tensor]
    ) -> None:
        self.values = values
        self._prover, self._head = prover, head
        self._outputs: list[Tensor] | None = outputs
        self._recorded: tuple[list, list] | None = None
        self._shapes = [out.shape for out in outputs]
        self._key: tuple[str, tuple] = (head.func_name, ())  # with shapes when sliceable
        self._kinds: list[str] = []
        self._specs = iter(self._slices())
        self._next = self._next_slice()  # the first sliced point, as a plan (or None)
        self._ready: list[tuple[list, list]] = []

    @property
    def sliceable(self) -> bool:
        """Whether the call has a sliced point (asked before any point is tried)."""
        return self._next is not None

    def _slices(self) -> tuple[tuple[int, bool], ...]:
        """The sliced points worth trying: those :data:`~torchlens.replay.cut_rules.CUT_RULES`
        allows for the function (none for any other: a cut call is made only where the
        kernel is known to accept it), none for a small call, one image with whole weights
        for a grouped convolution, and only those keeping whole weights for a call without
        parameters or buffers."""
        head = self._head
        if head.func is None or any(value.is_nested for value in self.values):
            return ()  # (a jagged tensor's sizes are symbolic: no slicing plan)
        if any(type(value) is not Tensor and inner_of(value) is not None for value in self.values):
            return ()  # a DTensor: slicing a sharded dimension would communicate
        if not large_enough(self.values, self._shapes):
            return ()
        points = cut_points(head.func, head.func_name, self.values)
        if not points:
            return ()
        self._key = (head.func_name, tuple(value.shape for value in self.values))
        trace = self._prover.runner.trace
        self._kinds = [getattr(trace[ref.label], "kind", "op") for ref in head.parent_args]
        if head.func_name in _CONVOLUTIONS and _grouped(self.values):
            return _ONE_ROW
        if "parameter" in self._kinds or "buffer" in self._kinds:
            return points
        return tuple(point for point in points if not point[1])

    def _next_slice(self) -> tuple[list, bool, int] | None:
        """The next sliced point that exists for this call, as a plan (it is cut when
        tried); the later ones are only worked out if an edge needs them."""
        for dims, weights in self._specs:
            if (self._key, dims, weights) in self._prover.refused:
                continue
            plan = slice_plan(self.values, self._kinds, self._shapes, dims, weights)
            if plan is not None and weights and dims > 1 and all(n < dims for _, n in plan):
                continue  # only weights cut (a convolution's input is no sequence): the
                # one-row point with cut weights cuts the same weights and the batch too
            if plan is not None:
                return plan, weights, dims
        return None

    def release(self) -> None:
        """Drop the recorded outputs until they are needed again."""
        self._outputs = None

    @property
    def recorded(self) -> tuple[list[Tensor], list[Baseline]] | None:
        """The recorded point and baselines of its outputs, made on first use (most
        edges are proved at a sliced point); None if the call no longer runs."""
        if self._recorded is None:
            outputs = self._outputs
            if outputs is None:
                try:
                    outputs = self._prover.runner.run_call(self._head, self.values)
                except Exception:  # noqa: BLE001 - it ran in the replay; be safe anyway
                    return None
            self._recorded = (self.values, self._prover.baselines(outputs))
        return self._recorded

    def __iter__(self) -> Iterator[tuple[list[Tensor], list[Baseline], bool]]:
        """``(values, baselines, recorded)`` of each point: sliced ones, then the recorded."""
        index = 0
        while True:
            while index >= len(self._ready):
                pending, self._next = self._next or self._next_slice(), None
                if pending is None:
                    break
                point = self._run(*pending)
                if point is not None:
                    self._ready.append(point)
            if index >= len(self._ready):
                if self.recorded is not None:
                    yield (*self.recorded, True)
                return
            yield (*self._ready[index], False)
            index += 1

    def _run(self, plan: list, weights: bool, dims: int) -> tuple[list, list] | None:
        prover = self._prover
        if (self._key, dims, weights) in prover.refused:
            return None
        small = cut(self.values, plan)
        try:
            outputs = prover.runner.run_call(self._head, small, sliced=True)
            return small, prover.baselines(outputs)
        except Exception:  # noqa: BLE001 - the call is not separable this way
            prover.refused.add((self._key, dims, weights))
            return None
