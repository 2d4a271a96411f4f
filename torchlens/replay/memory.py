"""Edges the recorded memory layout proves without a call.

* A ``refresh`` op is the value of a tensor after writes made through other views of its
  memory: the stale value, then each write laid over its region in order (replay redoes
  exactly that, ``interpreter.write_through``). A parent whose elements are not all
  overwritten by later writes appears, element for element, in the output at the places
  that survive: every change of it changes the output. The replay arm checks the geometry
  itself (the recorded value must equal the writes redone over the stale value).
* An output that is a view of part of its parent (``select``, ``narrow``, a slice, a
  diagonal) holds elements of the parent: every change of those changes it. (A view of all
  of it, reordered at most, is ``perturb.same_elements``.)

Such an edge is proved as it stands. A loop writing each channel of a large tensor through
a view and reading it back (torch's ``nn.CrossMapLRN2d``) would otherwise probe the whole
tensor at every step, to see a small part of it move.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from torchlens._tensors import dense, geometry_end

__all__ = ["surviving_parents", "part_of"]


def surviving_parents(op: Any, trace: Any) -> frozenset[str]:
    """The labels of ``op``'s parents (a ``refresh`` op of ``trace``) with some element in
    its value: a write reaching some element of it that later writes leave, and the stale
    value when the writes leave some element of it. Empty when a geometry is missing
    (then every edge is probed as usual)."""
    base = op.meta.get("geometry")
    refs = op.parent_args
    if base is None or len(refs) < 2:
        return frozenset()
    regions = [trace[ref.label].meta.get("geometry") for ref in refs[1:]]
    if any(region is None for region in regions):
        return frozenset()
    if len(regions) == 1 and dense(base):  # the usual refresh: one write since the value
        return _one_write(refs[0].label, refs[1].label, base, regions[0])
    geometries = [base, *regions]
    start = min(geometry[2] for geometry in geometries)
    extent = max(geometry_end(geometry) for geometry in geometries) - start
    # True where nothing of a parent can show: outside the base, or written over later
    written = torch.ones(max(extent, 0), dtype=torch.bool)
    stale = written.as_strided(base[0], base[1], base[2] - start)
    stale.fill_(False)
    kept: set[str] = set()
    for ref, region in zip(reversed(refs[1:]), reversed(regions)):  # the last write first
        place = written.as_strided(region[0], region[1], region[2] - start)
        if place.numel() and not bool(place.all()):
            kept.add(ref.label)
        place.fill_(True)
    if stale.numel() and not bool(stale.all()):
        kept.add(refs[0].label)
    return frozenset(kept)


def _one_write(stale: str, writer: str, base: tuple, region: tuple) -> frozenset[str]:
    """:func:`surviving_parents` of a refresh with one write, over a dense base
    (``_tensors.dense``: it holds every storage slot from its offset to its end): the
    write shows where it lies inside the base, and the stale value where the write, of
    fewer elements, leaves some of it. Decided without a mask over the whole base."""
    begin, end = base[2], geometry_end(base)
    size = math.prod(region[0])
    if size == 0:
        return frozenset({stale})
    inside = begin <= region[2] and geometry_end(region) <= end
    if not inside:  # (partly outside: the masks of the general case decide)
        return frozenset()
    return frozenset({writer, stale}) if size < end - begin else frozenset({writer})


def part_of(out: torch.Tensor, parent: torch.Tensor) -> bool:
    """Whether every element of ``out`` is an element of ``parent``, by address: ``out``
    (of ``parent``'s dtype, at least one element) lies within the memory of a ``parent``
    that fills its own span (``_tensors.dense``), so a view such as ``parent.select(1, c)``."""
    if out.layout != _STRIDED or parent.layout != _STRIDED or out.is_quantized:
        return False
    size = parent.element_size()
    start, first = parent.data_ptr(), out.data_ptr()
    if not start <= first < start + parent.numel() * size:  # the usual answer, asked first
        return False
    if out.dtype != parent.dtype or out.device != parent.device or not out.numel():
        return False
    if out.is_conj() != parent.is_conj() or out.is_neg() != parent.is_neg():
        return False
    if not dense((tuple(parent.shape), parent.stride(), 0)):
        return False
    span = geometry_end((tuple(out.shape), out.stride(), 0))
    return first + span * size <= start + parent.numel() * size


_STRIDED = torch.strided
