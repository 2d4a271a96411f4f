"""``Tensor.backward`` called inside a forward, made a call with outputs.

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

__all__ = ["BACKWARD", "backward_call", "backward_outputs"]

Tensor = torch.Tensor
BACKWARD = Tensor.backward
_ORDER = ("gradient", "retain_graph", "create_graph", "inputs")  # after self


def backward_call(args: tuple, kwargs: dict, builder: Any) -> tuple[tuple, dict]:
    """``Tensor.backward``'s arguments all by position, ``inputs`` the leaves it writes;
    as given when a leaf's ``.grad`` is already set (it would accumulate), or when it
    names no ``inputs`` and a recorded non-leaf ``retain_grad()``-s (naming the leaves
    would leave that one's ``.grad`` unwritten)."""
    given = dict(zip(_ORDER, args[1:]))
    given.update(kwargs)
    output = args[0]
    inputs = given.get("inputs")
    if isinstance(inputs, Tensor):
        inputs = (inputs,)
    if inputs is None:
        if _retaining(builder):
            return args, kwargs
        inputs = _leaves(output)
    inputs = tuple(inputs)
    if any(leaf.grad is not None for leaf in inputs):
        return args, kwargs
    given["inputs"] = inputs
    return (output, *(given.get(name) for name in _ORDER)), {}


def backward_outputs(args: tuple, result: Any) -> list[tuple[str, Tensor]]:
    """The ``.grad`` of each leaf ``Tensor.backward`` wrote (``args`` as rewritten by
    :func:`backward_call`; none when it was left as given)."""
    if len(args) != 1 + len(_ORDER) or not isinstance(args[-1], tuple):
        return []
    return [
        (f"4.{k}", leaf.grad)
        for k, leaf in enumerate(args[-1])
        if isinstance(leaf, Tensor) and leaf.grad is not None
    ]


def _retaining(builder: Any) -> bool:
    """Whether a tensor the capture recorded is a non-leaf that retains its grad."""
    for entry in list(builder._live.values()):
        tensor = entry[0]()
        if tensor is not None and tensor.retains_grad:
            return True
    return False


def _leaves(output: Tensor) -> tuple[Tensor, ...]:
    """The leaves requiring grad that ``output``'s autograd graph reaches, in the order
    first met."""
    found: dict[int, Tensor] = {}
    seen: set[Any] = set()
    stack = [output.grad_fn] if output.grad_fn is not None else []
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
