"""Values made out of the capture's sight, linked to where they came from.

A ``@torch.jit.script`` helper or a C++ extension op called from an eager forward runs
its kernels without Python dispatch, so the capture mode sees none of them: their result
first appears as an argument of a later call, a tensor no recorded op made. When it has
autograd history, that history says what it was computed from: its ``grad_fn`` graph is
walked back to the nodes of recorded ops' values (a node and output number, as
``tensor.grad_fn`` and ``tensor.output_nr`` name them) and to leaves
(``AccumulateGrad.variable``: parameters, inputs that require grad). The value is then
recorded as one opaque op with those parents (:func:`record_unseen`), named after what
made it when that can be told:

* a TorchScript function the calling code names (its current line first, as a global, a
  local or an attribute of ``self``; then the function's other names; then the names the
  model's ``forward`` methods use) that gives the value back from the parents in some
  order, with, when it takes more tensors, recorded values autograd does not track (an
  input that does not require grad): it is the op's function, ``script_<name>``, and
  replay and perturbation re-run it like any call;
* else (an extension's kernel, a helper with a non-tensor argument) the op has no function
  to re-run; it is named after the one TorchScript function its line names, else after
  the value's ``grad_fn`` (``MulBackward0``, an extension's ``Backward``), and its edges
  are proven at capture time by autograd (a non-zero vector-Jacobian product with a
  random vector shows the value moves with that parent), kept in ``op.meta["unseen"]``.

A value the calling frame holds in a variable that was made out of sight too (``g =
fused_gate(a, b)`` before ``silu(g)``) stops the walk and is recorded first, as its own op.
Under ``torch.no_grad`` such a value has no history, so nothing links it: it stays a
constant, and validation says that it cannot tell.
"""

from __future__ import annotations

import itertools
import linecache
import re
from typing import Any

import torch

from torchlens.capture import rng
from torchlens.capture.source import caller_frame
from torchlens.capture.tree import ArgSlot
from torchlens.trace import ArgRef

__all__ = ["record_unseen", "UNSEEN_META", "MAX_WALK"]

Tensor = torch.Tensor
UNSEEN_META = "unseen"  # op.meta key: {"made_by", "edges": {label: proven}, "rerun": bool}
MAX_WALK = 100_000  # autograd nodes walked back at most, per value
_MAX_TRIES = 48  # calls tried to find a TorchScript function's arguments
_MAX_EXTRAS = 4  # untracked values of the calling frame tried as its other arguments
_TENSOR_TYPES = ("Tensor", "Optional[Tensor]")


def record_unseen(builder: Any, tensor: Tensor) -> str | None:
    """Record ``tensor`` (with autograd history, made by no recorded op) as an opaque op
    whose parents its autograd graph leads back to (see the module docstring).

    Args:
        builder: the capture's :class:`~torchlens.capture.builder.TraceBuilder`.
        tensor: the value, first seen as an argument or an output.

    Returns:
        The op's label, or None when the graph reaches no recorded value (it then stays
        a constant, ``unseen computation``).

    What it runs itself (the walk, a TorchScript function tried, the proof of its edges)
    is not part of the forward: the capture mode does not see it, wherever it is asked
    from (a module's exit hook runs with the mode on)."""
    with torch._C.DisableTorchFunction():
        frame = caller_frame()
        parents = _parents(builder, tensor, _held(builder, frame, tensor))
        if not parents:
            return None
        order = {label: i for i, label in enumerate(builder._records)}
        labels = sorted(parents, key=order.__getitem__)  # in the order they were recorded
        values = [parents[label] for label in labels]
        script, chosen = _scripted_maker(frame, tensor, list(zip(labels, values)), builder)
        if script is not None:
            labels, values = [label for label, _ in chosen], [value for _, value in chosen]
            name, func = f"script_{script.name}", script
        else:  # the one TorchScript function the line names, else what autograd calls it
            on_line = _scripts_in_frame(frame)[0]
            name = f"script_{on_line[0].name}" if len(on_line) == 1 else None
            name, func = name or type(tensor.grad_fn).__name__, None
        refs = [ArgRef(label, str(i)) for i, label in enumerate(labels)]
        slots = tuple(ArgSlot(i) for i in range(len(refs)))
        (op,) = builder.record_call(name, func, slots, {}, refs, [tensor], inplace=False)
        edges = {} if func is not None else _proven_edges(tensor, labels, values)
        op.meta[UNSEEN_META] = {"made_by": name, "edges": edges, "rerun": func is not None}
        return op.label


def _held(builder: Any, frame: Any, tensor: Tensor) -> dict[tuple[Any, int], Tensor]:
    """Values the calling frame holds in its variables that were also made out of sight
    (``g = scripted_gate(a, b)`` before ``silu(g)``), by autograd node: the walk stops at
    them, and each is recorded as an opaque op of its own."""
    values = list(frame.f_locals.values()) if frame is not None else []
    return {
        (value.grad_fn, value.output_nr): value
        for value in values
        if isinstance(value, Tensor)
        and value is not tensor
        and value.grad_fn is not None
        and builder._current_label(value) is None
    }


def _parents(builder: Any, tensor: Tensor, held: dict) -> dict[str, Tensor]:
    """The recorded values (by label, each with its live tensor) that ``tensor``'s
    autograd graph reaches first, walking back from its ``grad_fn``; a ``held`` value
    reached is recorded first (:meth:`TraceBuilder.label_of` comes back here)."""
    known: dict[tuple[Any, int], tuple[str, Tensor]] = {}
    leaves: dict[int, tuple[str, Tensor]] = {}
    for entry in list(builder._live.values()):
        value = entry()
        if value is None or not value.requires_grad:
            continue
        label = builder._current_label(value)
        if label is None:
            continue
        node = value.grad_fn
        if node is None:
            leaves[id(value)] = (label, value)
        else:
            known[(node, value.output_nr)] = (label, value)
    found: dict[str, Tensor] = {}
    seen: set[Any] = set()
    stack = [tensor.grad_fn]
    while stack and len(seen) < MAX_WALK:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        for edge, number in node.next_functions:
            if edge is None:
                continue
            hit = known.get((edge, number))
            if hit is None and (edge, number) in held:
                value = held.pop((edge, number))
                hit = known[(edge, number)] = (builder.label_of(value), value)
            if hit is None and type(edge).__name__ == "AccumulateGrad":
                variable = edge.variable
                hit = leaves.get(id(variable)) or (builder.label_of(variable), variable)
            if hit is not None:
                found.setdefault(*hit)
            elif edge not in seen:
                stack.append(edge)
    return found


def _scripted_maker(
    frame: Any, tensor: Tensor, parents: list[tuple[str, Tensor]], builder: Any
) -> tuple[Any, list[tuple[str, Tensor]]]:
    """A TorchScript function the calling code names that gives ``tensor`` back from the
    ``parents`` in some order, with (when it takes more tensors) recorded values the frame
    holds that autograd does not track (an input that does not require grad leaves no
    trace in the graph): tried without grad, the RNG put back. Returns it and its
    arguments, or ``(None, [])``."""
    extras = _untracked(builder, frame, {label for label, _ in parents})
    tries = 0
    on_line, others = _scripts_in_frame(frame)
    for script in _unique([*on_line, *others, *_scripts_of_modules(builder)]):
        arguments = script.schema.arguments
        missing = len(arguments) - len(parents)
        if missing < 0 or missing > len(extras):
            continue
        if not all(str(arg.type) in _TENSOR_TYPES for arg in arguments):
            continue
        for more in itertools.combinations(extras, missing):
            for order in itertools.permutations([*parents, *more]):
                tries += 1
                if tries > _MAX_TRIES:
                    return None, []
                if _gives(script, [value for _, value in order], tensor):
                    return script, list(order)
    return None, []


def _untracked(builder: Any, frame: Any, parents: set[str]) -> list[tuple[str, Tensor]]:
    """Recorded values autograd does not track: in the frame's variables, then the
    forward's inputs (a value returned by the forward is seen after its frame is gone)."""
    found: dict[str, Tensor] = {}
    inputs = set(builder.input_labels)
    held = list(frame.f_locals.values()) if frame is not None else []
    live = [value for entry in list(builder._live.values()) if (value := entry()) is not None]
    held += [value for value in live if builder._current_label(value) in inputs]
    for value in held:
        if isinstance(value, Tensor) and not value.requires_grad:
            label = builder._current_label(value)
            if label is not None and label not in parents:
                found.setdefault(label, value)
    return list(found.items())[:_MAX_EXTRAS]


def _scripts_of_modules(builder: Any) -> list[Any]:
    """TorchScript functions the model's ``forward`` methods name, as globals or as
    attributes of their module (for a value first seen after its frame returned)."""
    found = []
    codes: set[Any] = set()
    for _, module in getattr(builder, "named_modules", ()):
        forward = getattr(type(module).forward, "__code__", None)
        if forward is None:
            continue
        if forward not in codes:
            codes.add(forward)
            scope = type(module).forward.__globals__
            found += [scope.get(name) for name in forward.co_names]
        found += [module.__dict__.get(name) for name in forward.co_names]
    return [value for value in found if isinstance(value, _SCRIPTED)]


def _unique(scripts: list[Any]) -> list[Any]:
    """``scripts`` without repeats, in order."""
    return list({id(script): script for script in scripts}.values())


def _gives(script: Any, values: list[Tensor], tensor: Tensor) -> bool:
    """Whether ``script(*values)`` is ``tensor``'s value (the RNG left as it was)."""
    state = rng.snapshot()
    try:
        with torch.no_grad():
            result = script(*[value.clone() for value in values])  # (it may write)
    except Exception:  # noqa: BLE001 - not its arguments
        return False
    finally:
        rng.restore(state)
    return (
        isinstance(result, Tensor)
        and result.shape == tensor.shape
        and result.dtype == tensor.dtype
        and bool(torch.equal(result, tensor.detach()))
    )


def _scripts_in_frame(frame: Any) -> tuple[list[Any], list[Any]]:
    """TorchScript functions bound to names the ``frame``'s code uses: those its current
    line names (as globals, locals or attributes of ``self``), and the others (a value
    held in a variable was made on an earlier line)."""
    if frame is None:
        return [], []
    code = frame.f_code
    line = linecache.getline(code.co_filename, frame.f_lineno)
    on_line = sorted(set(re.findall(r"[A-Za-z_]\w*", line)))
    others = sorted({*code.co_names, *code.co_varnames}.difference(on_line))
    scope = {**frame.f_globals, **frame.f_locals}
    owner = frame.f_locals.get(code.co_varnames[0]) if code.co_argcount else None
    named = [scope.get(name) for name in on_line]
    if owner is not None:  # self.gate(...): a scripted attribute the line names
        named += [getattr(owner, name, None) for name in on_line]
    scripts = _unique([value for value in named if isinstance(value, _SCRIPTED)])
    rest = [scope.get(name) for name in others]
    return scripts, [value for value in rest if isinstance(value, _SCRIPTED)]


_SCRIPTED = torch.jit.ScriptFunction  # (a scripted submodule is refused: refusals.py)


def _proven_edges(tensor: Tensor, labels: list[str], values: list[Tensor]) -> dict[str, bool]:
    """For each parent, whether ``tensor`` moves with it: a non-zero vector-Jacobian
    product with a random vector (an infinitesimal perturbation), from the live graph."""
    generator = torch.Generator(device=tensor.device).manual_seed(0)
    if not tensor.is_floating_point():
        return dict.fromkeys(labels, False)
    vector = torch.randn(tensor.shape, generator=generator, device=tensor.device)
    try:
        with torch.enable_grad():
            grads = torch.autograd.grad(
                tensor, values, vector.to(tensor.dtype), retain_graph=True, allow_unused=True
            )
    except RuntimeError:  # a graph autograd cannot walk back (no derivative)
        return dict.fromkeys(labels, False)
    return {
        label: grad is not None and bool(grad.ne(0).any()) for label, grad in zip(labels, grads)
    }
