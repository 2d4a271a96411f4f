"""Replay of ``torch.autograd.grad`` (and ``Tensor.backward``) called inside a forward.

Such a call differentiates the forward's live autograd graph, which replay from saved
values does not have. It is re-made: the recorded sub-graph between the inputs the call
differentiates with respect to and the outputs it differentiates (the ops that descend
from the first and lead to the second) is re-executed from saved values, with grad
enabled and a fresh leaf requiring grad standing for each input, and that is
differentiated with the call's own arguments (``grad_outputs``, ``create_graph``...).
Every value the sub-graph reads besides the inputs (weights, other activations) is the
saved one, so the replayed gradient is the one the recorded graph implies: it matches
the recorded value only when the record holds every op between them.

The op's edges: ``grad_outputs`` and the inputs are proved by perturbation like any
argument (moving an input moves the gradient of a non-linear map). The edge from a
differentiated output is of another kind: the gradient reads that output's *graph*, not
its value, so moving the value cannot show it. It is proven by the sub-graph: the output
is made from the inputs by recorded ops (each replayed against its saved value), and
re-made with the inputs moved, it moves (:func:`graph_edge`). The same proof serves an
input whose gradient is the same at every probe (a linear map: the gradient is a
constant, but of that input).

Its sibling, :func:`unseen_verdicts`, gives the verdicts on the other op replay cannot
re-make from one recorded function: a value made out of the capture's sight by something
that cannot be re-run (:mod:`torchlens.capture.unseen`), whose edges autograd proved at
capture time.
"""

from __future__ import annotations

from typing import Any

import torch

from torchlens.capture import BACKWARDS, UNSEEN_META, backward_roles, fill, flatten
from torchlens.replay.exemptions import may_write_arguments
from torchlens.replay.lint import slot_indices
from torchlens.replay.tolerances import mismatch

__all__ = ["GRAD_FUNCS", "differentiate", "differentiated", "graph_edge", "unseen_verdicts"]

Tensor = torch.Tensor
GRAD_FUNCS = (torch.autograd.grad, *BACKWARDS)  # replayed by differentiate


def _roles(op: Any) -> tuple[list[int], list[int]]:
    """The argument slots of the differentiated outputs and of the inputs."""
    args, kwargs = op.args_template, op.kwargs_template
    if op.func in BACKWARDS:  # (tensors, gradients, ..., inputs): grad_calls.py
        outputs, _, inputs = backward_roles(op.func)
        return slot_indices(args[outputs]), slot_indices(args[inputs])
    outputs = args[0] if args else kwargs.get("outputs")
    inputs = args[1] if len(args) > 1 else kwargs.get("inputs")
    return slot_indices(outputs), slot_indices(inputs)


def differentiated(op: Any) -> set[str]:
    """The labels of the outputs the gradient op ``op`` differentiates."""
    return {op.parent_args[i].label for i in _roles(op)[0]}


def _subgraph(trace: Any, op: Any, inputs: set[str], outputs: set[str]) -> list[list[Any]]:
    """The calls (each a list of its ops) recorded before ``op`` that descend from the
    ``inputs`` and lead to the ``outputs``, in execution order."""
    below: set[str] = set(inputs)
    before = [other for other in trace.ops[: op.index] if other.call_index != op.call_index]
    for other in before:
        if not below.isdisjoint(other.parents):
            below.add(other.label)
    needed: set[str] = set()
    stack = [label for label in outputs if label in below]
    while stack:
        label = stack.pop()
        if label in needed or label in inputs:
            continue
        needed.add(label)
        stack += [p for p in getattr(trace[label], "parents", ()) if p in below]
    wanted = {other.call_index for other in before if other.label in needed}
    calls: dict[int, list[Any]] = {}
    for other in before:
        if other.call_index in wanted:
            calls.setdefault(other.call_index, []).append(other)
    return list(calls.values())


def _remake(interp: Any, op: Any, values: list[Tensor]) -> tuple[dict[str, Tensor], list]:
    """Re-execute the sub-graph from the input values (each made a leaf requiring grad
    unless it requires grad already: a second-order backward hands its own leaves).
    Returns the values made, by label, and the input leaves in slot order."""
    trace = interp.trace
    out_slots, in_slots = _roles(op)
    made: dict[str, Tensor] = {}
    leaves = []
    for i in in_slots:
        value = values[i]
        leaf = value if value.requires_grad else value.detach().requires_grad_()
        made.setdefault(op.parent_args[i].label, leaf)
        leaves.append(made[op.parent_args[i].label])
    outputs = {op.parent_args[i].label for i in out_slots}
    subgraph = _subgraph(trace, op, set(made), outputs)
    problem = _not_remade(interp, subgraph)
    if problem:
        from torchlens.replay.interpreter import Unreplayable  # (it imports this module)

        raise Unreplayable(problem)
    for call in subgraph:
        head = call[0]
        args = [made[label] if label in made else interp.value(label)
                for label, _ in head.parent_args]  # fmt: skip
        if head.is_inplace or may_write_arguments(head):
            args = [arg.clone() for arg in args]  # (never into a leaf or a saved value)
        results = interp.execute(head, args)
        for member in call:  # (one made without grad in the forward stays so: no_grad)
            value = results[member.output_index]
            made[member.label] = value if member.requires_grad else value.detach()
    return made, leaves


def _not_remade(interp: Any, subgraph: list[list[Any]]) -> str | None:
    """Why the recorded ``subgraph`` does not differentiate as the forward's graph did, or
    None: an edit replaced a value inside it (a what-if rerun), or an op gained a gradient
    that none of its recorded arguments carried (the output of a custom
    ``autograd.Function``, whose own backward replay cannot re-make)."""
    edited = set(interp.edited)
    trace = interp.trace
    for call in subgraph:
        head = call[0]
        if edited.intersection(member.label for member in call):
            label = next(member.label for member in call if member.label in edited)
            return (
                f"an edit replaced {label!r} inside the graph it differentiates, which "
                "the recorded graph cannot differentiate"
            )
        if (
            any(member.requires_grad for member in call)
            and head.func_name != "requires_grad_"
            and not any(trace[label].requires_grad for label in head.parents)
        ):
            return (
                f"{head.label!r} carries a gradient none of its recorded arguments does "
                "(the output of a custom autograd.Function, differentiated by its own "
                "backward), inside the graph it differentiates"
            )
    return None


def differentiate(interp: Any, op: Any, values: list[Tensor]) -> list[Tensor]:
    """The outputs of the recorded ``torch.autograd.grad`` call ``op``, re-made from
    ``values`` (its tensor arguments, slot order) as the module docstring says."""
    out_slots, in_slots = _roles(op)
    with torch.enable_grad():
        made, leaves = _remake(interp, op, values)
        given = list(values)
        for i in out_slots:
            given[i] = made.get(op.parent_args[i].label, values[i])
        for i, leaf in zip(in_slots, leaves):
            given[i] = leaf
        args, kwargs = fill(op.args_template, given), fill(op.kwargs_template, given)
        if op.func in BACKWARDS:  # the .grad it writes, as autograd.grad gives them
            outputs, gradients, inputs = backward_roles(op.func)
            kwargs = {"allow_unused": True, "create_graph": bool(args[3])}
            args = (args[outputs], args[inputs], args[gradients])
        result = torch.autograd.grad(*args, **kwargs)
    return [tensor for _, tensor in flatten(result)[0]]


def graph_edge(interp: Any, op: Any, label: str, values: list[Tensor]) -> tuple[str, str]:
    """The verdict on the edge from ``label`` (a differentiated output, or an input) to the
    gradient op ``op``: verified when every differentiated output is made from the inputs
    by recorded ops (each replayed and compared with its saved value by the replay arm) and
    moves away from its saved value when the inputs move."""
    out_slots, _ = _roles(op)
    outputs = list(dict.fromkeys(op.parent_args[i].label for i in out_slots))
    try:
        with torch.no_grad():
            moved_values = [_moved(value, op, i) for i, value in enumerate(values)]
            moved, _ = _remake(interp, op, moved_values)
    except Exception as err:  # noqa: BLE001 - the sub-graph did not run again
        return "unchecked", f"re-making the graph {label!r} feeds raised {err}"
    for output in outputs:
        if output not in moved:
            return "failed", f"{output!r} is not made from the inputs by recorded ops"
        if not mismatch(moved[output], interp.trace[output].out):
            return "failed", f"{output!r} does not move when the inputs move"
    return "verified", label


def _moved(value: Tensor, op: Any, i: int) -> Tensor:
    """``value`` with noise added when slot ``i`` is an input of ``op``, else as it is."""
    _, in_slots = _roles(op)
    if i not in in_slots or not value.is_floating_point():
        return value
    scale = value.detach().abs().mean().clamp(min=1.0) * 0.1
    generator = torch.Generator(device=value.device).manual_seed(i)
    noise = torch.randn(value.shape, generator=generator, device=value.device)
    return value.detach() + noise.to(value.dtype) * scale


def unseen_verdicts(ops: list[Any], findings: Any) -> None:
    """The verdicts on an op made out of the capture's sight by something that cannot be
    re-run (:mod:`~torchlens.capture.unseen`): its replay is not checked, saying why, and
    each edge is as autograd proved it at capture time."""
    head = ops[0]
    unseen = head.meta[UNSEEN_META]
    verdicts = [
        ("verified", label) if unseen["edges"].get(label) else (
            "unchecked", f"{label}: the value made out of sight did not move with it "
            "(a zero vector-Jacobian product at the recorded point)")
        for label in head.parents
    ]  # fmt: skip
    for op in ops:
        findings.unchecked(
            op.label, "replay",
            f"made out of the capture's sight by {unseen['made_by']}, which replay cannot "
            "re-run (not a TorchScript function of tensors that the calling code names); "
            "each of its edges was proven by autograd at capture time, and an argument "
            "autograd does not track (one that does not require grad) has no edge",
        )  # fmt: skip
        findings.perturbed(op.label, verdicts)
