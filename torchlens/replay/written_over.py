"""Replay of refreshes the store keeps as their writes (``_store.WrittenOver``).

The capture keeps a ``refresh`` as "the stale value, with these writes over it" when the
writes it recorded account for every change of the tensor's version counter. Redoing them
from the saved values is then the value itself, so the replay arm checks the recipe against
the op's record and makes the value once, instead of making it and replaying it again.

A loop writing one channel of a large tensor at a time (torch's ``nn.CrossMapLRN2d``)
makes a chain of such refreshes, each the previous one with one more write. Each would
cost a copy of the whole tensor; here the value made for the previous step is written
over in place instead, when nothing else holds it or its memory any more (no name, no
view: the readers of that step have been replayed and let it go).
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from torchlens._store import WrittenOver
from torchlens._tensors import dense, geometry_end, storage_address, write_through
from torchlens.replay.memory import surviving_parents

__all__ = ["MadeRefreshes", "recipe_of"]

Tensor = torch.Tensor
# how many holders of a storage there are (tensors, views, storage objects); private to
# torch: without it, a value is never written over in place
_storage_use_count = getattr(torch._C, "_storage_Use_Count", None)


def recipe_of(op: Any, trace: Any) -> WrittenOver:
    """A refresh's record as a :class:`~torchlens._store.WrittenOver`: its stale value, its
    writes with their regions, and its own geometry."""
    stale, *writers = (ref.label for ref in op.parent_args)
    writes = tuple((writer, trace[writer].meta.get("geometry")) for writer in writers)
    return WrittenOver(stale, writes, op.meta.get("geometry"))


class MadeRefreshes:
    """The values of a checker's refreshes kept as writes: :meth:`value` makes each one.

    ``saved`` is the checker's own label -> value map (the values its replays read);
    a value made here is put there, and taken back out when the next step writes over it.
    """

    def __init__(self, trace: Any, saved: dict[str, Tensor]) -> None:
        self.trace = trace
        self._saved = saved
        self._ours: set[str] = set()  # labels whose value in saved was made here

    def recipe(self, op: Any) -> WrittenOver | None:
        """How the store will make ``op``'s value, when that is exactly ``op``'s record
        (so the value made is its replay); else None (``op`` is replayed as any call: a
        value made already, by a read before this check, is compared as any other)."""
        recipe_in_store = getattr(self.trace.store, "recipe_of", None)
        recipe = recipe_in_store(op.label) if recipe_in_store is not None else None
        if recipe is None or recipe != recipe_of(op, self.trace):
            return None
        return recipe

    def value(self, op: Any, recipe: WrittenOver) -> tuple[Tensor, list[Tensor]]:
        """``op``'s value, and the values of its parents (slot order) as the perturbation
        arm reads them; raises ``PayloadUnavailableError`` when a saved value is missing."""
        saved = self._saved
        writes = [self._read(writer) for writer, _ in recipe.writes]
        pairs = [(write, region) for write, (_, region) in zip(writes, recipe.writes)]
        if recipe.stale in self._ours and self._over_in_place(op, recipe):
            stale = saved.pop(recipe.stale)
            self._ours.discard(recipe.stale)
            if _alone(stale) and _write_over(stale, pairs, recipe.base):
                saved[op.label] = stale
                self._ours.add(op.label)
                return stale, [stale, *writes]
            saved[recipe.stale] = stale  # (not written: still the stale value)
            self._ours.add(recipe.stale)
        stale = self._read(recipe.stale)
        value = saved[op.label] = write_through(stale, pairs, recipe.base)
        self._ours.add(op.label)
        return value, [stale, *writes]

    def _read(self, label: str) -> Tensor:
        value = self._saved.get(label)
        if value is None:
            value = self._saved[label] = self.trace[label].out
        return value

    def _over_in_place(self, op: Any, recipe: WrittenOver) -> bool:
        """Whether the perturbation arm will read nothing of the stale value but its
        geometry: every parent's elements survive in the output (``memory.py``), so no
        edge is probed and the stale value may be written over."""
        if _storage_use_count is None:
            return False
        parents = {recipe.stale, *(writer for writer, _ in recipe.writes)}
        return parents <= surviving_parents(op, self.trace)


def _alone(tensor: Tensor) -> bool:
    """Whether nothing but the caller's one name holds ``tensor``, and nothing else its
    memory (no view of it)."""
    return sys.getrefcount(tensor) <= _ONE_NAME and _storage_use_count(storage_address(tensor)) == 1


def _references_to_one_name() -> int:
    """What :func:`_alone` counts for a tensor its caller holds under one name: this
    caller's name, the parameter, getrefcount's argument, where the interpreter counts
    each (it may borrow some), measured the way :func:`_alone` measures it."""
    probe = torch.empty(0)
    return _count_in_callee(probe)


def _count_in_callee(tensor: Tensor) -> int:
    return sys.getrefcount(tensor)


_ONE_NAME = _references_to_one_name()


def _write_over(value: Tensor, writes: list[tuple[Tensor, tuple]], base: tuple) -> bool:
    """Copy each write over its region of ``value``, laid out as ``base`` from the start of
    its own storage, when every region lies inside the base; False (nothing written) when
    that does not hold."""
    if (
        not dense(base)
        or value.storage_offset() != 0
        or tuple(value.stride()) != tuple(base[1])
        or tuple(value.shape) != tuple(base[0])
    ):
        return False
    start, end = base[2], geometry_end(base)
    for written, region in writes:
        if region[2] < start or geometry_end(region) > end or written.dtype != value.dtype:
            return False
    for written, region in writes:
        value.as_strided(region[0], region[1], region[2] - start).copy_(written)
    return True
