"""``Tensor.backward`` (and ``torch.autograd.backward``) inside a forward, made a call
with outputs.

``y.backward(create_graph=True)`` returns nothing; what it produces is the ``.grad`` of
the leaves it reaches, which later ops of the forward read (a Hamiltonian network's
``dq = q.grad``). :func:`backward_call` rewrites the call before it is recorded into the
same call with every argument by position and the leaves it will write named as
``inputs`` (found by walking ``y``'s autograd graph when the forward did not name them),
so they are its parents; :func:`backward_outputs` (a
:data:`~torchlens.capture.special.SPECIAL_OUTPUTS` entry) gives their ``.grad`` after it
as its outputs. Replay re-makes them by differentiating the recorded sub-graph
(:mod:`torchlens.replay.grad_replay`). A leaf whose ``.grad`` already holds a gradient
would be accumulated into, so such a call is left as it is (unrecorded), as is one naming
no ``inputs`` while a non-leaf retains its grad (naming the leaves would skip it).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["BACKWARDS", "backward_call", "backward_outputs", "backward_roles"]

Tensor = torch.Tensor
# each backward function, with its parameters after the first (what it differentiates)
BACKWARDS: dict[Any, tuple[str, ...]] = {
    Tensor.backward: ("gradient", "retain_graph", "create_graph", "inputs"),
    torch.autograd.backward: (
        "grad_tensors", "retain_graph", "create_graph", "grad_variables", "inputs",
    ),
}  # fmt: skip


def backward_roles(func: Any) -> tuple[int, int, int]:
    """The positions, in a call :func:`backward_call` rewrote, of what ``func``
    differentiates, of the gradients it is handed, and of the leaves it writes."""
    return 0, 1, len(BACKWARDS[func])


def backward_call(func: Any, args: tuple, kwargs: dict, builder: Any) -> tuple[tuple, dict]:
    """A backward call's arguments all by position, ``inputs`` the leaves it writes; as
    given when a leaf's ``.grad`` is already set (it would accumulate), or when it names
    no ``inputs`` and a recorded non-leaf ``retain_grad()``-s (naming the leaves would
    leave that one's ``.grad`` unwritten)."""
    order = BACKWARDS[func]
    given = dict(zip(order, args[1:]))
    given.update(kwargs)
    output = args[0]
    inputs = given.get("inputs")
    if isinstance(inputs, Tensor):
        inputs = (inputs,)
    if inputs is None:
        if _retaining(builder):
            return args, kwargs
        inputs = _leaves(output)
    if not isinstance(inputs, (tuple, list)) or not all(isinstance(t, Tensor) for t in inputs):
        return args, kwargs  # (gradient edges, a dict: left as given)
    inputs = tuple(inputs)
    if any(leaf.grad is not None for leaf in inputs):
        return args, kwargs
    given["inputs"] = inputs
    return (output, *(given.get(name) for name in order)), {}


def backward_outputs(args: tuple, result: Any) -> list[tuple[str, Tensor]]:
    """The ``.grad`` of each leaf a backward call wrote (``args`` as rewritten by
    :func:`backward_call`, its leaves last; none when it was left as given)."""
    if len(args) not in _REWRITTEN or not isinstance(args[-1], tuple) or args[-1] == ():
        return []
    last = len(args) - 1
    return [
        (f"{last}.{k}", leaf.grad)
        for k, leaf in enumerate(args[-1])
        if isinstance(leaf, Tensor) and leaf.grad is not None
    ]


_REWRITTEN = frozenset(1 + len(order) for order in BACKWARDS.values())


def _retaining(builder: Any) -> bool:
    """Whether a tensor the capture recorded is a non-leaf that retains its grad."""
    return any((t := entry()) is not None and t.retains_grad for entry in [*builder._live.values()])


def _leaves(outputs: Any) -> tuple[Tensor, ...]:
    """The leaves requiring grad that the autograd graph of ``outputs`` (a tensor or a
    sequence of them) reaches, in the order first met."""
    found: dict[int, Tensor] = {}
    seen: set[Any] = set()
    outputs = (outputs,) if isinstance(outputs, Tensor) else tuple(outputs)
    stack = [t.grad_fn for t in reversed(outputs) if isinstance(t, Tensor) and t.grad_fn]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if type(node).__name__ == "AccumulateGrad":
            found.setdefault(id(node.variable), node.variable)
            continue
        stack += [edge for edge, _ in reversed(node.next_functions) if edge is not None]
    return tuple(found.values())
