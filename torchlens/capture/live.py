"""The live-tensor versions of a capture that keeps no graph (``tl.record``, ``tl.extract``,
``find_nonfinite``): enough to count a ``refresh`` op exactly where ``tl.trace`` records one.

:class:`~torchlens.capture.builder.TraceBuilder` maps every live tensor to the record of its
current value and the version counter at that moment; a tensor read again after its version
moved without the capture seeing the write (a write through a view, a buffer a kernel
updates) gets a ``refresh`` op. :class:`LiveVersions` keeps the same map without labels and
answers, per read, whether that read is such a refresh, by the same rules
(``TraceBuilder.label_of``, ``_unversioned``, ``_label_of_unshared``): a version that
moved; for a tensor without a version counter (an inference tensor) or a storage reached
through ``x.data``, a recorded in-place write into its storage since its value was taken.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import nn

from torchlens._tensors import storage_key
from torchlens.capture.tree import _SLOTS, ATOMS, flatten_call, plain_slice

__all__ = ["LiveVersions", "LiveEntry"]

Tensor = torch.Tensor
_Parameter = nn.Parameter
_ref = weakref.ref
# id(tensor) -> (weak reference, version when its value was counted (None: an inference
# tensor), call count then): the writes into its storage after that call are what change it
LiveEntry = tuple[Any, "int | None", int]


class LiveVersions:
    """Which live tensor holds which version; see the module docstring."""

    __slots__ = ("entries", "calls", "writers", "unshared", "inference", "slow")

    def __init__(self) -> None:
        self.entries: dict[int, LiveEntry] = {}
        self.calls = 0  # the calls counted so far (ops, and refreshes: one call each)
        self.writers: dict[Any, list[int]] = {}  # storage -> call counts of writes into it
        self.unshared: frozenset[Any] = frozenset()  # storages reached through x.data
        # under torch.inference_mode() most new tensors have no version: told apart first
        self.inference = torch.is_inference_mode_enabled()
        self.slow = self.inference  # every read asks stale(): unversioned or unshared values

    def remember(self, tensor: Tensor) -> None:
        """``tensor``'s current value is counted now."""
        if self.inference and tensor.is_inference():
            version = None
        else:
            try:
                version = tensor._version
            except RuntimeError:  # an inference tensor made under a mode the model entered
                version = None
        if version is None:  # reads must ask stale(): the inline checks read versions
            self.slow = True
        self.entries[id(tensor)] = (_ref(tensor), version, self.calls)

    def stale(self, tensor: Tensor) -> bool:
        """Whether reading ``tensor`` now is a refresh; a tensor not seen before is
        remembered (a source: an input, a weight, a constant)."""
        entry = self.entries.get(id(tensor))
        if entry is None or entry[0]() is not tensor:
            self.remember(tensor)
            return False
        version = entry[1]
        if version is None:
            return self._written_since(tensor, entry[2])
        if version != tensor._version:
            return True
        return bool(self.unshared) and self._written_since(tensor, entry[2], self.unshared)

    def _written_since(self, tensor: Tensor, since: int, among: Any = None) -> bool:
        key = storage_key(tensor)
        if key is None or among is not None and key not in among:
            return False
        writes = self.writers.get(key)
        return bool(writes) and writes[-1] > since

    def read(self, args: tuple, kwargs: dict | None) -> list[Tensor]:
        """The tensors of a call's arguments whose reads are refreshes, in the order
        ``TraceBuilder.arguments`` reads them (usually none: the common call, tensors and
        atoms side by side, is checked here in one pass)."""
        stale: list[Tensor] = []
        if len(args) <= len(_SLOTS) and all(type(v) in ATOMS for v in (kwargs or {}).values()):
            entries, unshared = self.entries, self.unshared
            try:
                for arg in args:
                    kind = type(arg)
                    if kind is Tensor or kind is _Parameter:
                        entry = entries.get(id(arg))
                        if (
                            entry is None
                            or entry[0]() is not arg
                            or entry[1] is None
                            or entry[1] != arg._version
                            or unshared
                        ) and self.stale(arg):
                            self._counted(arg, stale)
                    elif not (kind in ATOMS or kind is slice and plain_slice(arg)):
                        break  # nested: walked below
                else:
                    return stale
            except RuntimeError:  # an inference tensor has no version: walked below
                pass
        for _, tensor in flatten_call(args, kwargs or {})[0]:
            if self.stale(tensor):
                self._counted(tensor, stale)
        return stale

    def read_all(self, tensors: list[Tensor]) -> list[Tensor]:
        """Those of ``tensors`` (a module call's inputs or outputs, an escape's, the
        forward's outputs) whose reads are refreshes, in order."""
        stale: list[Tensor] = []
        for tensor in tensors:
            if self.stale(tensor):
                self._counted(tensor, stale)
        return stale

    def _counted(self, tensor: Tensor, stale: list[Tensor]) -> None:
        """A refresh of ``tensor``: a call of its own, its value counted from now on."""
        self.calls += 1
        self.remember(tensor)
        stale.append(tensor)

    def produced(self, name: str, tensors: list[Tensor], inplace: bool) -> None:
        """A call counted as ops produced ``tensors`` (written in place: ``inplace``)."""
        self.calls += 1
        if name == "data" or name == "set_data":  # an alias with a version counter of its own
            key = storage_key(tensors[0])
            if key is not None:
                self.unshared = self.unshared | {key}
                self.slow = True
        for tensor in tensors:
            if inplace and name != "set_data":
                key = storage_key(tensor)
                if key is not None:
                    self.writers.setdefault(key, []).append(self.calls)
            self.remember(tensor)
