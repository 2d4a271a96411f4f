"""Validation of backward capture (``scope="backward"``): are the captured grads the true ones?

Two arms, reported through the same :class:`~torchlens.replay.status.ReplayStatus`:

* **ground truth** — the pristine model (no capture), rerun from the captured RNG state and
  buffers on copies of the inputs, gives ``torch.autograd.grad`` of the same loss w.r.t. its
  parameters and inputs; each must equal the captured grad of that source.
* **replay** (per-op vector-Jacobian replay) — autograd can only be asked about the tensors a
  pristine run exposes, which are the leaves; intermediate values are proved locally instead.
  Each recorded call is re-executed from its saved parent values (made leaves), and the VJP
  with its outputs' captured grads is what it passes back to each parent. The chain rule says
  a record's gradient is the sum of what its consumers pass back (plus ``d loss / d output``
  for returned values), so every captured grad is checked against its children's grads.
  With the loss at the root this proves every grad by induction, and a wrong grad fails at
  the op that holds it (and at its parents, whose expectation it feeds).

A record whose expectation cannot be completed (a consumer that cannot be replayed, a
parent value not saved, a ``torch.autograd.grad(..., create_graph=True)`` call in the forward
whose output reads values the trace does not show as its arguments) is counted as
unverified, never as passed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from torchlens.capture import (
    default_loss,
    fill,
    flatten,
    grad_untracked,
    normalize_call,
    rng,
    suspended,
)
from torchlens.capture import trace as capture
from torchlens.errors import GradUnavailableError, PayloadUnavailableError
from torchlens.replay.exemptions import MUTATES_ARGUMENTS
from torchlens.replay.findings import Findings
from torchlens.replay.ground_truth import ModelState, copy_inputs, rerun
from torchlens.replay.interpreter import Interpreter, Unreplayable, calls
from torchlens.replay.status import ReplayStatus
from torchlens.replay.tolerances import mismatch

__all__ = ["validate_backward", "check_backward", "reference_grads"]

Tensor = torch.Tensor
LossFn = Callable[[Any], Tensor]
_UNCHECKABLE = ("not_saved", "grad_aliased")  # captured grads that were never kept


def validate_backward(
    model: Any,
    args: Any = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    atol: float | None = None,
    rtol: float | None = None,
    loss_fn: LossFn | None = None,
) -> ReplayStatus:
    """Capture with ``save_grads=True``, run backward, and prove every captured gradient.

    The model's ``.grad`` fields (and the inputs') are left as they were; buffers and RNG as
    one plain forward leaves them.

    Args:
        model: an ``nn.Module`` or a function of tensors.
        args: positional arguments (one object, or a tuple/list of them).
        kwargs: keyword arguments.
        atol: absolute tolerance for floating values (default: per-dtype table).
        rtol: relative tolerance for floating values (default: per-dtype table).
        loss_fn: maps the output to a scalar loss (default: sum of floating outputs' sums).

    Returns:
        The :class:`ReplayStatus` of arms ``ground_truth`` and ``replay``.

    Example:
        >>> import torch
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
        >>> validate_backward(model, torch.randn(2, 4)).state
        'passed'
    """
    args, kwargs = normalize_call(args, kwargs, model)
    pristine = copy_inputs(args, kwargs)
    originals = [t for _, t in flatten((args, kwargs))[0]]
    state = ModelState(model)
    grads_before = _saved_grads(model, originals)
    start = rng.snapshot(host=True)  # the reference run draws what the capture drew
    trace = capture(model, args, kwargs, save_grads=True)
    after_capture = rng.snapshot(host=True)
    try:
        trace.backward(loss_fn)
    finally:
        for tensor, grad in grads_before:  # the caller's, put back
            tensor.grad = grad
    findings = Findings(trace)
    check_grads(trace, findings, atol, rtol, loss_fn)
    if not state.rerun_blocked(findings):
        state.rewind()
        input_labels = _input_labels(trace, originals)
        reference = reference_grads(model, *pristine, start, loss_fn, input_labels)
        compare_sources(trace, reference, findings, atol, rtol)
    rng.restore(after_capture)
    return findings.status(("ground_truth", "replay"))


def check_backward(
    trace: Any,
    reference: Mapping[str, Tensor | None] | None = None,
    *,
    atol: float | None = None,
    rtol: float | None = None,
    loss_fn: LossFn | None = None,
) -> ReplayStatus:
    """Check the captured grads of a trace on which backward has run, without its model.

    Args:
        trace: a trace captured with ``save_grads=True`` after ``trace.backward(loss_fn)``.
        reference: independent gradients of sources by label (see :func:`reference_grads`),
            compared as the ground-truth arm; None to skip that arm.
        atol: absolute tolerance for floating values (default: per-dtype table).
        rtol: relative tolerance for floating values (default: per-dtype table).
        loss_fn: the loss that backward used (default: :func:`default_loss`).

    Returns:
        The :class:`ReplayStatus`; ``unavailable`` for a trace that holds no values.
    """
    findings = Findings(trace)
    if trace.structure_only:
        findings.unchecked("trace", "replay", "structure_only trace: no values to replay")
        return findings.status(("replay",), unavailable=True)
    check_grads(trace, findings, atol, rtol, loss_fn)
    if reference is None:
        return findings.status(("replay",))
    compare_sources(trace, reference, findings, atol, rtol)
    return findings.status(("ground_truth", "replay"))


def reference_grads(
    model: Any,
    args: tuple,
    kwargs: dict,
    rng_state: dict | None,
    loss_fn: LossFn | None = None,
    input_labels: list[str | None] | None = None,
) -> dict[str, Tensor | None]:
    """Gradients of a pristine run's loss w.r.t. parameters (by address) and inputs.

    ``input_labels`` names the flattened input tensors (None skips one); repeated labels add.
    """
    # inputs that require grad as passed: one the forward turns on itself
    # (x.requires_grad_()) had none at the capture's input record
    leaves = [t for _, t in flatten((args, kwargs))[0]]
    tracked = [t.requires_grad for t in leaves]
    with torch.enable_grad():
        output = rerun(model, args, kwargs, rng_state)
        loss = (loss_fn or default_loss)(output)
        targets: list[tuple[str, Tensor]] = []
        if isinstance(model, torch.nn.Module):
            targets += [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        for label, tensor, wanted in zip(input_labels or [], leaves, tracked):
            if label is not None and wanted:
                targets.append((label, tensor))
        if not targets:
            return {}
        grads = _grads_with_side_effects(loss, [t for _, t in targets])
    reference: dict[str, Tensor | None] = {}
    for (label, _), grad in zip(targets, grads):
        reference[label] = _add(reference.get(label), grad)
    return reference


def _grads_with_side_effects(loss: Tensor, tensors: list[Tensor]) -> list[Tensor | None]:
    """``torch.autograd.grad(loss, tensors)``, plus what the backward put into the leaves'
    ``.grad`` on the way: a custom ``autograd.Function`` whose backward recomputes its
    forward and calls ``.backward()`` on it (a reversible layer, as in Reformer)
    accumulates its parameters' gradients there, out of ``autograd.grad``'s sight. A
    forward through a reentrant ``torch.utils.checkpoint``, which refuses
    ``autograd.grad``, has its gradients taken from ``.grad`` after ``loss.backward()``.
    The leaves' ``.grad`` are put back as they were."""
    leaves = list({id(t): t for t in tensors if t.is_leaf}.values())
    before = [t.grad for t in leaves]
    for leaf in leaves:
        leaf.grad = None
    try:
        try:
            # the graph is kept for the fallback below: a refusal comes mid-backward
            grads: Any = torch.autograd.grad(loss, tensors, allow_unused=True, retain_graph=True)
        except RuntimeError as err:
            if "use_reentrant" not in str(err):
                raise
            # a reentrant torch.utils.checkpoint refuses autograd.grad: everything into .grad
            for tensor in tensors:
                if not tensor.is_leaf:  # an input copy made with autograd history
                    tensor.retain_grad()
            loss.backward()
            grads = [None] * len(tensors)
        held = {id(t): t for t in tensors if t.is_leaf or t.retains_grad}
        side = {key: t.grad for key, t in held.items() if t.grad is not None}
    finally:
        for leaf, grad in zip(leaves, before):
            leaf.grad = grad
    return [_add(grad, side.get(id(t))) for t, grad in zip(tensors, grads)]


def compare_sources(
    trace: Any, reference: Mapping[str, Tensor | None], findings: Findings, atol, rtol
) -> None:
    """Arm 1: each source's captured grad against the pristine run's."""
    by_label = {s.path if s.kind == "parameter" else s.label: s for s in trace.sources}
    for key, expected in reference.items():
        source = by_label.get(key)
        if source is None:  # a parameter the forward never read
            continue
        _judge(findings, source.label, "ground_truth", _captured(source), expected, atol, rtol)


_UNTRACKED_VIEW = (
    "{label!r} was made without gradient tracking (a view a custom autograd.Function "
    "returned, as nn.Module's full backward hooks make), so its gradient passes by an "
    "autograd node the trace did not hook"
)


def check_grads(trace: Any, findings: Findings, atol, rtol, loss_fn: LossFn | None) -> None:
    """Arm 2: every record's captured grad against the VJPs of its consumers."""
    vjp = _VjpReplay(trace)
    with suspended(), rng.restored(rng.snapshot()):
        vjp.add_loss(loss_fn or default_loss)
        vjp.run()
    op_labels = {op.label for op in trace.ops}
    for record in [*trace.ops, *trace.sources]:
        label = record.label
        if not record.requires_grad:
            if label in op_labels:
                findings.replayed(label)  # autograd cannot reach it: no grad, as captured
            continue
        captured = _captured(record)
        if isinstance(captured, GradUnavailableError) and captured.code in _UNCHECKABLE:
            findings.unchecked(label, "replay", f"no captured grad to check: {captured}")
        elif label in vjp.blocked:
            findings.unchecked(label, "replay", vjp.blocked[label])
        elif label in vjp.opaque and _problem(captured, vjp.expected.get(label), atol, rtol):
            findings.unchecked(label, "replay", vjp.opaque[label])
        elif grad_untracked(record) and _problem(captured, vjp.expected.get(label), atol, rtol):
            findings.unchecked(label, "replay", _UNTRACKED_VIEW.format(label=label))
        elif _judge(findings, label, "replay", captured, vjp.expected.get(label), atol, rtol):
            if label in op_labels:
                findings.replayed(label)


class _VjpReplay(Interpreter):
    """Sums, for each record, what its consumers pass back: ``expected[label]``.

    Calls are visited last to first, so a record's sum is complete before its own call is
    replayed; a consumer whose grad was not kept passes back its *expected* grad instead.
    """

    def __init__(self, trace: Any) -> None:
        super().__init__(trace)
        self.expected: dict[str, Tensor] = {}
        self.blocked: dict[str, str] = {}  # label -> why its expected sum is incomplete
        # label -> why gradient may reach it by a path the trace does not show (a consumer
        # recorded without grad tracking, an autograd.grad call with create_graph=True)
        self.opaque: dict[str, str] = {}
        self._walked: set[str] = set()  # ancestors of autograd.grad calls already marked

    def run(self) -> None:
        for ops in reversed(list(calls(self.trace))):
            self.visit(ops)

    def visit(self, ops: list[Any]) -> None:
        head = ops[0]
        slots = [
            i for i, ref in enumerate(head.parent_args) if _differentiable(self.trace[ref.label])
        ]
        if not slots:
            return
        if not any(op.requires_grad and not grad_untracked(op) for op in ops):
            reason = (
                f"consumer {head.label!r} was recorded without grad tracking (e.g. inside a "
                "custom autograd.Function), so gradient may reach this record by a path the "
                "trace does not show"
            )
            for i in slots:
                self.opaque.setdefault(head.parent_args[i].label, reason)
            return
        if head.func is torch.autograd.grad and any(op.requires_grad for op in ops):
            self._hidden_consumer(head)
        grads = [self._grad_of(op) for op in ops]
        unknown = [g for g in grads if isinstance(g, str)]
        if unknown:
            return self._block(head, slots, unknown[0])
        pairs = [(op.output_index, g) for op, g in zip(ops, grads) if isinstance(g, Tensor)]
        if not pairs:
            return  # no gradient reached this call, so it passes nothing back
        try:
            contributions = self._vjp(head, slots, pairs)
        except (PayloadUnavailableError, Unreplayable) as err:
            return self._block(head, slots, f"consumer {head.label!r} cannot be replayed: {err}")
        except Exception as err:  # noqa: BLE001 - the call did not differentiate on replay
            reason = f"VJP of consumer {head.label!r} raised {type(err).__name__}: {err}"
            return self._block(head, slots, reason)
        for i, contribution in zip(slots, contributions):
            label = head.parent_args[i].label
            self.expected[label] = _add(self.expected.get(label), contribution)

    def _hidden_consumer(self, head: Any) -> None:
        """A ``torch.autograd.grad(..., create_graph=True)`` call inside the forward: its
        output's graph reads values saved along everything it differentiated, so gradient
        reaches those records (its arguments' ancestors) by edges the trace does not show."""
        reason = (
            f"{head.label!r} (torch.autograd.grad with create_graph=True) built its output "
            "from values saved inside the graph it differentiated, so gradient may reach "
            "this record by a path the trace does not show"
        )
        stack = [ref.label for ref in head.parent_args]
        while stack:  # each record once, over all such calls: the walk stays linear
            label = stack.pop()
            if label in self._walked:
                continue
            self._walked.add(label)
            self.opaque.setdefault(label, reason)
            stack += [ref.label for ref in getattr(self.trace[label], "parent_args", ())]

    def _grad_of(self, op: Any) -> Tensor | str | None:
        """The captured grad; for one not kept, the expected one; a string if unknown."""
        grad = _captured(op)
        if isinstance(grad, Tensor):
            return grad
        if grad.code not in _UNCHECKABLE:
            return None
        if op.label in self.blocked:
            return f"the grad of consumer {op.label!r} is neither kept nor derivable"
        return self.expected.get(op.label)

    def _vjp(self, head: Any, slots: list[int], pairs: list[tuple[int, Tensor]]) -> tuple:
        values = self.parent_values(head)
        leaves = {i: values[i].detach().clone().requires_grad_() for i in slots}
        writes = head.is_inplace or head.func_name in MUTATES_ARGUMENTS or head.func is None
        inputs = [leaves.get(i, value) for i, value in enumerate(values)]
        if writes:  # the call writes into its arguments: never into a leaf or a saved value
            inputs = [value.clone() for value in inputs]
        with torch.enable_grad():
            outputs = self.execute(head, inputs)
            if any(index >= len(outputs) or not outputs[index].requires_grad for index, _ in pairs):
                raise Unreplayable("its replayed output does not require grad")
            return torch.autograd.grad(
                [outputs[index] for index, _ in pairs],
                [leaves[i] for i in slots],
                [grad.to(outputs[index].dtype) for index, grad in pairs],
                allow_unused=True,
            )

    def _block(self, head: Any, slots: list[int], reason: str) -> None:
        for i in slots:
            self.blocked.setdefault(head.parent_args[i].label, reason)

    def add_loss(self, loss_fn: LossFn) -> None:
        """What the loss passes back to each returned value: ``d loss / d output``."""
        leaves, template = flatten(self.trace.output)
        copies = [t.detach().clone().requires_grad_(t.requires_grad) for _, t in leaves]
        wanted = [i for i, t in enumerate(copies) if t.requires_grad]
        if not wanted:
            return
        with torch.enable_grad():
            loss = loss_fn(fill(template, copies))
            grads = torch.autograd.grad(loss, [copies[i] for i in wanted], allow_unused=True)
        for i, grad in zip(wanted, grads):
            label = self.trace.output_labels[i]
            self.expected[label] = _add(self.expected.get(label), grad)


def _judge(findings: Findings, label: str, arm: str, captured, expected, atol, rtol) -> bool:
    """Record a failure if ``captured`` is not ``expected``; True when they agree."""
    problem = _problem(captured, expected, atol, rtol)
    if problem:
        findings.fail(label, arm, problem)
    return problem is None


def _problem(captured, expected: Tensor | None, atol, rtol) -> str | None:
    """Why the captured grad is not the expected one, or None when they agree.

    A missing grad and an all-zero one are the same answer (autograd may skip zero grads).
    """
    got = captured if isinstance(captured, Tensor) else None
    if got is None and isinstance(captured, GradUnavailableError) and captured.code != "no_grad":
        return f"gradient unavailable after backward: {captured}"
    if got is None or expected is None:
        present = got if got is not None else expected
        if present is None or not bool(present.detach().ne(0).any()):
            return None
        if got is None:
            return "no gradient was captured, but its consumers pass one back"
        return "a gradient was captured, but nothing passes one back"
    problem = mismatch(got, expected.to(got.dtype), atol, rtol)
    return f"captured grad differs from the expected one: {problem}" if problem else None


def _captured(record: Any) -> Tensor | GradUnavailableError:
    try:
        return record.grad
    except GradUnavailableError as err:
        return err


def _differentiable(record: Any) -> bool:
    return bool(record.requires_grad) and (
        record.dtype.is_floating_point or record.dtype.is_complex
    )


def _add(total: Tensor | None, value: Tensor | None) -> Tensor | None:
    if value is None:
        return total
    return value if total is None else total + value.to(total.dtype)


def _input_labels(trace: Any, originals: list[Tensor]) -> list[str | None]:
    """The source label of each flattened input tensor (a tensor passed twice is one)."""
    labels, seen = [], {}
    queue = iter(trace.input_labels)
    for tensor in originals:
        if id(tensor) not in seen:
            seen[id(tensor)] = next(queue, None)
        labels.append(seen[id(tensor)])
    return labels


def _saved_grads(model: Any, inputs: list[Tensor]) -> list[tuple[Tensor, Tensor | None]]:
    """The ``.grad`` of every leaf the check's backward may reach, taken off them: a
    backward accumulates into a ``.grad`` in place (a step accumulating micro-batches, or
    ``zero_grad(set_to_none=False)``), so the caller's is set aside and put back."""
    tensors = list(model.parameters()) if isinstance(model, torch.nn.Module) else []
    tensors += [t for t in inputs if t.is_leaf and t.requires_grad]
    saved = [(t, t.grad) for t in tensors]
    for tensor in tensors:
        tensor.grad = None
    return saved
