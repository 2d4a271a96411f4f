"""Copies of saved values made just before something writes into their memory.

The capture keeps values as aliases of the live tensors and copies them only when a write
is about to reach their storage (``TraceBuilder.protect``). The aliases of one storage are
copied together: one that is the same view as another copied then, or lies inside the
memory of a larger dense one (a slice of a tensor saved whole, the input squares
``nn.CrossMapLRN2d`` reads channel by channel), becomes that copy or the same view of
it. Memory the forward shared stays shared in the trace, and is copied once.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from torchlens._tensors import (
    copy_keeping_layout,
    dense,
    geometry,
    geometry_end,
    storage_address,
)

__all__ = ["copies_before_write"]

Tensor = torch.Tensor
CONTAINERS = 4  # the largest copies of one call that later aliases may lie in


def copies_before_write(aliases: list[tuple[str, Tensor]]) -> Iterator[tuple[str, Tensor | None]]:
    """Each ``(label, value)`` of ``aliases`` (saved values of one storage, each still
    holding what it held when saved) with its copy, or None when its dtype cannot be
    copied (``quint4x2``)."""
    if len(aliases) == 1:  # the usual case
        label, value = aliases[0]
        yield label, _copy(value)
        return
    copied: list[tuple[Tensor, Tensor, bool]] = []  # (value, its copy, whether it holds)
    for label, value in sorted(aliases, key=lambda alias: alias[1].numel(), reverse=True):
        copy = None
        for container, made, holds in copied:
            copy = _view_inside(value, container, made, holds)
            if copy is not None:
                break
        if copy is None:
            copy = _copy(value)
            if copy is not None and len(copied) < CONTAINERS:
                copied.append((value, copy, _holds(value, copy)))
        yield label, copy


def _copy(value: Tensor) -> Tensor | None:
    try:
        return copy_keeping_layout(value.detach())
    except (RuntimeError, NotImplementedError):  # quint4x2 cannot be copied
        return None


def _holds(value: Tensor, copy: Tensor) -> bool:
    """Whether ``copy`` (of ``value``) can hold views of the other aliases lying inside
    ``value``: a dense value, copied with its strides (else only the same view again)."""
    return copy.stride() == value.stride() and dense(geometry(value) or ((), (), 0))


def _view_inside(value: Tensor, container: Tensor, copy: Tensor, holds: bool) -> Tensor | None:
    """``value`` as a view of ``copy`` (of ``container``, an alias of the same storage)
    when it is the same view, or (``holds``: see :func:`_holds`) has all its elements
    inside the container's; else None."""
    if value.dtype != container.dtype or value.layout is not torch.strided:
        return None
    # a lazily conjugated or negated view reads the same memory as other values: only
    # plain ones share (x and x.conj() lie in one storage, with one geometry)
    for tensor in (value, container):
        if tensor.is_quantized or tensor.is_conj() or tensor.is_neg():
            return None
    # (an alias noted under this storage's key may have moved to another storage since:
    # an edit's replacement, a freed storage whose address was reused)
    if storage_address(value) != storage_address(container):
        return None
    place, around = geometry(value), geometry(container)
    if place is None or around is None:
        return None
    if place == around:
        return copy
    offset, start = place[2], around[2]
    if not holds or offset < start or geometry_end(place) > geometry_end(around):
        return None
    return copy.as_strided(value.shape, value.stride(), copy.storage_offset() + offset - start)
