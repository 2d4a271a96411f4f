"""Wrapping a tensor in a traceable wrapper subclass, and unwrapping it, as ops.

A wrapper subclass (a ``DTensor`` holds its local shard) is made and taken apart out of the
function mode's sight: ``DTensor.from_local`` wraps a tensor the forward computed, ``to_local``
reads the shard of a ``DTensor`` an op returned, inside autograd functions no mode sees. So
that the graph does not break there, a tensor first read by an op is linked to the recorded
value it is made of: the wrapper that holds it (an ``unwrap`` op), or the value it holds (a
``wrap`` op, replayed by putting the replayed value in a wrapper of the same metadata).
Nothing here knows a particular subclass; see :func:`torchlens._tensors.inner_of`.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from torchlens._tensors import inner_of, rewrap

__all__ = ["Wrappers", "unwrap", "Rewrap", "WRAP", "UNWRAP"]

WRAP, UNWRAP = "wrap", "unwrap"


def unwrap(wrapper: torch.Tensor) -> torch.Tensor:
    """The tensor ``wrapper`` holds (what an ``unwrap`` op replays)."""
    inner = inner_of(wrapper)
    if inner is None:
        raise TypeError(f"a {type(wrapper).__name__} holds no single tensor to unwrap")
    return inner


class Rewrap:
    """What a ``wrap`` op replays: the value put in a wrapper like the recorded one."""

    __name__ = WRAP

    def __init__(self, like: torch.Tensor) -> None:
        self.like = like.detach()

    def __call__(self, inner: torch.Tensor) -> torch.Tensor:
        return rewrap(self.like, inner)

    def __repr__(self) -> str:
        return f"wrap into {type(self.like).__name__}"


class Wrappers:
    """The recorded wrapper values, by the tensor each holds."""

    def __init__(self) -> None:
        # id(inner) -> (inner, the wrapper holding it)
        self._held: dict[int, tuple[weakref.ref, weakref.ref]] = {}

    def note(self, tensor: torch.Tensor) -> None:
        """``tensor``, a recorded value, may be a wrapper: remember what it holds."""
        inner = inner_of(tensor)
        if inner is not None:
            self._held[id(inner)] = (weakref.ref(inner), weakref.ref(tensor))

    def link(self, builder: Any, tensor: torch.Tensor) -> str | None:
        """The label of a new op linking ``tensor``, not seen before, to the recorded value it
        is made of (see the module docstring); None when it is made of none."""
        entry = self._held.get(id(tensor))
        wrapper = entry[1]() if entry is not None and entry[0]() is tensor else None
        if wrapper is not None:
            return _record(builder, UNWRAP, unwrap, wrapper, tensor)
        inner = inner_of(tensor)
        if inner is None:
            return None
        return _record(builder, WRAP, Rewrap(tensor), inner, tensor)


def _record(
    builder: Any, name: str, func: Any, argument: torch.Tensor, tensor: torch.Tensor
) -> str:
    refs, template, _ = builder.arguments((argument,), {})
    (op,) = builder.record_call(name, func, template, {}, refs, [tensor], inplace=False)
    return op.label
