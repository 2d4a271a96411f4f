"""The live-tensor map of every capture: which live tensor holds which value.

:class:`LiveVersions` maps every live tensor (by identity, checked through a weak
reference) to the label of its current value (``tl.trace``; a recording keeps none), the
version counter at that moment and the call count then, and logs the in-place writes into
each storage. A tensor read again after its version moved without the capture seeing the
write (a write through a view, a buffer a kernel updates) gets a ``refresh`` op; so does
one without a version counter (an inference tensor) or reached through ``x.data``, after a
recorded write into its storage since its value was taken. The trace asks this map in
``TraceBuilder.label_of``; a capture that keeps no graph (``tl.record``, ``tl.extract``,
``find_nonfinite``) in :meth:`LiveVersions.stale`, by the same rules, so both count a
``refresh`` at the same reads.
"""

from __future__ import annotations

import weakref
from collections import defaultdict
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from torchlens._tensors import geometry as _geometry
from torchlens._tensors import geometry_end, storage_key, version_of
from torchlens.capture.naming import SET_DATA, UNSHARING
from torchlens.capture.tree import _SLOTS, ATOMS, flatten_call, plain_slice

__all__ = ["LiveVersions", "LiveEntry", "live_entry", "SeenByRecord", "same_value"]

Tensor = torch.Tensor
_Parameter = nn.Parameter


class LiveEntry(weakref.ref):
    """A weak reference to a live tensor (call it for the tensor), carrying what the capture
    knows of its value: ``label``, the record that made it (None in a recording);
    ``version``, its version counter then (None: an inference tensor has none); ``calls``,
    the call count then (the writes into its storage after that call are what change it).

    One object is the reference and the record at once: as cheap to make as the tuple of
    a weak reference and three fields, and cheaper to read (the per-op path reads it).
    """

    __slots__ = ("label", "version", "calls")
    label: str | None
    version: Any
    calls: int


def live_entry(tensor: Tensor, label: str | None, version: Any, calls: int) -> LiveEntry:
    """A :class:`LiveEntry` of ``tensor`` (the per-op paths make theirs inline)."""
    entry = LiveEntry(tensor)
    entry.label, entry.version, entry.calls = label, version, calls
    return entry


class LiveVersions:
    """Which live tensor holds which version; see the module docstring."""

    __slots__ = (
        "entries",
        "calls",
        "writers",
        "unshared",
        "inference",
        "slow",
        "since",
        "on",
        "last",
    )

    def __init__(self, on_refresh: Any = None, on_unseen: Any = None) -> None:
        self.entries: dict[int, LiveEntry] = {}
        self.calls = 0  # the calls counted so far (ops, and refreshes: one call each)
        # storage -> the in-place writes into it, in order: (call count, label (None in a
        # recording), where it wrote (a geometry; None in a recording), dtype written)
        self.writers: defaultdict[Any, list[tuple[int, str | None, Any, Any]]] = defaultdict(list)
        self.unshared: frozenset[Any] = frozenset()  # storages reached through x.data
        # under torch.inference_mode() most new tensors have no version: told apart first
        self.inference = torch.is_inference_mode_enabled()
        # every read asks stale(): unversioned or unshared values (or a recording that
        # names every tensor, or counts by reserved names, asks it to)
        self.slow = self.inference
        # the autograd sequence number now: a value first seen with a later grad_fn was made
        # during the forward, out of sight (capture/unseen.py); None: no autograd here
        self.since = _sequence_now() if on_unseen is not None else None
        # called at each refresh stale() finds, in order; and with each value made out of
        # sight (a trace, which asks label_of, passes neither). Held weakly: they are the
        # owning mode's methods, and a cycle through them kept its kept values (a batch's
        # activations, in tl.extract) alive until the next garbage collection
        self.on = (_weak(on_refresh), _weak(on_unseen))
        # the weak reference of the tensor the latest counted call made, while nothing was
        # counted since and reads are fast (a recording sets it): a module call reads it
        # without asking its version
        self.last: Any = None

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
            self.slow, self.last = True, None
        self.entries[id(tensor)] = live_entry(tensor, None, version, self.calls)

    def stale(self, tensor: Tensor) -> bool:
        """Whether reading ``tensor`` now is a refresh; a tensor not seen before is
        remembered (a source: an input, a weight, a constant)."""
        entry = self.entries.get(id(tensor))
        if entry is None or entry() is not tensor:
            if self.made_unseen(tensor):  # counted as an op, as tl.trace records it
                self.on[1]()(tensor)
            else:
                self.remember(tensor)
            return False
        version = entry.version
        if version is None:
            return self.written_since(tensor, entry.calls)
        if version != tensor._version:
            return True
        return bool(self.unshared) and self.written_since(tensor, entry.calls, self.unshared)

    def made_unseen(self, tensor: Tensor) -> bool:
        """Whether ``tensor``, seen first now, got autograd history during the forward:
        computed out of the capture's sight (``capture/unseen.py``)."""
        node = tensor.grad_fn if self.since is not None else None
        return node is not None and node._sequence_nr() > self.since

    def written_since(self, tensor: Tensor, since: int, among: Any = None) -> bool:
        """Whether a recorded write went into ``tensor``'s storage (one of ``among``,
        when given) after call ``since``: what a moved version would say, for a tensor
        without a trustworthy one."""
        key = storage_key(tensor)
        if key is None or among is not None and key not in among:
            return False
        writes = self.writers.get(key)
        return bool(writes) and writes[-1][0] > since

    def wrote(self, key: Any, label: str | None, region: Any = None, dtype: Any = None) -> None:
        """The call counted last (the op ``label``, in a trace) wrote into storage ``key``
        in place, at ``region`` (a geometry), values of ``dtype``."""
        self.writers[key].append((self.calls, label, region, dtype))

    def writes_since(
        self, tensor: Tensor, stale_label: str, since: int, geometry: Any
    ) -> tuple[list[tuple[str, Any]], bool, int]:
        """The recorded writes that a ``refresh`` of ``tensor`` (a trace's) redoes over its
        stale value ``stale_label``, taken at call count ``since``, ``geometry`` its place.

        Every write into its storage since then, in order: a write into memory later
        reused by this storage came before ``since``, so the call counts also keep writes
        into freed tensors out. A write makes the writes before it moot where it covers
        them: all of them when it covers the whole tensor, an earlier write at the same
        place (``v.copy_(a); v.add_(b)``, a loop updating one slice) otherwise. Moot writes
        are left out: their values reach this one only through the write that overwrote
        them, and a parent that keeps no element would be an edge no probe can show.

        Returns the writes kept (``(label, region)``, in order), whether one of them
        covers the whole stale value, and how many writes there were, moot ones too.
        """
        key = storage_key(tensor)
        kept: dict[str, Any] = {}  # label -> region, in order
        at: dict[tuple, str] = {}  # (region, dtype) -> the last write kept there
        covered = False
        count = 0
        for when, writer, region, dtype in self.writers.get(key, ()) if key is not None else ():
            if when > since and writer != stale_label:
                count += 1
                if _covers(region, geometry):
                    kept.clear()
                    at.clear()
                    covered = True
                elif region is not None:
                    earlier = at.get((region, dtype))
                    if earlier is not None:
                        del kept[earlier]
                kept[writer] = region
                if region is not None:
                    at[region, dtype] = writer
        return list(kept.items()), covered, count

    def note_unshared(self, tensor: Tensor) -> bool:
        """``tensor`` came from ``x.data``: an alias with a version counter of its own, so
        its storage's versions are no longer to be trusted alone. Returns whether it is
        the first such storage."""
        key = storage_key(tensor)
        first = not self.unshared
        if key is not None:
            self.unshared = self.unshared | {key}
            self.slow, self.last = True, None
        return first and key is not None

    def read(self, args: tuple, kwargs: dict | None) -> None:
        """Read a call's arguments: each whose read is a refresh is counted, in the order
        ``TraceBuilder.arguments`` reads them (usually none: the common call, tensors and
        atoms side by side, is checked here in one pass)."""
        if len(args) <= len(_SLOTS) and all(type(v) in ATOMS for v in (kwargs or {}).values()):
            entries, unshared = self.entries, self.unshared
            try:
                for arg in args:
                    kind = type(arg)
                    if kind is Tensor or kind is _Parameter:
                        entry = entries.get(id(arg))
                        if (
                            entry is None
                            or entry() is not arg
                            or entry.version is None
                            or entry.version != arg._version
                            or unshared
                        ) and self.stale(arg):
                            self._counted(arg)
                    elif not (kind in ATOMS or kind is slice and plain_slice(arg)):
                        break  # nested: walked below
                else:
                    return
            except RuntimeError:  # an inference tensor has no version: walked below
                pass
        self.read_all([tensor for _, tensor in flatten_call(args, kwargs or {})[0]])

    def read_all(self, tensors: list[Tensor]) -> None:
        """Read ``tensors`` (a module call's inputs or outputs, an escape's, the forward's
        outputs): each whose read is a refresh is counted, in order."""
        for tensor in tensors:
            if self.stale(tensor):
                self._counted(tensor)

    def _counted(self, tensor: Tensor) -> None:
        """A refresh of ``tensor``: a call of its own, its value counted from now on."""
        self.calls += 1
        self.last = None
        self.remember(tensor)
        self.on[0]()(tensor)

    def produced(self, name: str, tensors: list[Tensor], inplace: bool) -> None:
        """A call counted as ops produced ``tensors`` (written in place: ``inplace``)."""
        self.calls += 1
        self.last = None
        if name in UNSHARING:
            self.note_unshared(tensors[0])
        for tensor in tensors:
            if inplace and name != SET_DATA:
                key = storage_key(tensor)
                if key is not None:
                    self.wrote(key, None)
            self.remember(tensor)


def _covers(region: tuple | None, base: tuple | None) -> bool:
    """Whether a write at ``region`` reaches every element at ``base`` (both geometries):
    the same layout, or a contiguous region spanning the base's whole extent."""
    if region is None or base is None:
        return False
    if region == base:
        return True
    shape, stride, offset = region
    expected = 1
    for size, step in reversed(list(zip(shape, stride))):
        if size != 1 and step != expected:
            return False
        expected *= size
    if any(size == 0 for size in base[0]):
        return True
    return offset <= base[2] and geometry_end(base) <= offset + expected


def _weak(method: Any) -> Any:
    """A weak reference to a bound method (None stays None)."""
    return None if method is None else weakref.WeakMethod(method)


def _sequence_now() -> int | None:
    """The autograd sequence number of a node made now (None: autograd is off here, as
    under ``torch.inference_mode()``)."""
    with torch.enable_grad(), torch._C.DisableTorchFunction():
        node = torch.empty(0, requires_grad=True).view(0).grad_fn
    return None if node is None else node._sequence_nr()


class SeenByRecord:
    """What :func:`~torchlens.capture.unseen.record_unseen` reads of a capture (under the
    names :class:`~torchlens.capture.builder.TraceBuilder` gives them), for a capture that
    keeps no labels: a live tensor is named ``(call that counted its value, its id)``, so
    names sort in the order values were counted, as a trace's records do.

    Args:
        live: the capture's live versions.
        count: called as ``count(name, tensor)`` to count the opaque op that made ``tensor``.
        inputs: ids of the forward's input tensors.
        modules: the ``(address, module)`` pairs named so far.
    """

    def __init__(
        self, live: LiveVersions, count: Callable[[str, Tensor], None], inputs: list[int],
        modules: list[tuple[str, nn.Module]],
    ) -> None:  # fmt: skip
        self.live, self.count, self.named_modules = live, count, modules
        self.input_labels = [
            (live.entries[key].calls, key) for key in inputs if key in live.entries
        ]

    @property
    def _live(self) -> dict[int, LiveEntry]:
        return self.live.entries  # (their labels are None: _current_label names them)

    @property
    def _records(self) -> list[tuple[int, int]]:
        return sorted((entry.calls, key) for key, entry in self.live.entries.items())

    def _current_label(self, tensor: Tensor) -> tuple[int, int] | None:
        entry = self.live.entries.get(id(tensor))
        return (entry.calls, id(tensor)) if entry is not None and entry() is tensor else None

    def label_of(self, tensor: Tensor) -> tuple[int, int] | None:
        """Read ``tensor`` as the capture does (a source, a refresh, or made out of sight)."""
        self.live.stale(tensor)
        return self._current_label(tensor)

    def record_call(self, name: str, *_: Any, **__: Any) -> list[Any]:
        """Count the opaque op that made ``outputs`` (``args[4]``, as the builder's)."""
        tensor = _[4][0]
        self.count(name, tensor)
        return [SimpleNamespace(label=self._current_label(tensor), meta={})]


def same_value(live: LiveVersions, tensor: Tensor) -> bool:
    """Whether a live tensor holds ``tensor``'s value under another object: the same
    memory, layout, dtype and version (``Tensor.as_subclass``), as
    ``TraceBuilder._same_memory`` finds it among saved values."""
    key = storage_key(tensor)
    if key is None:
        return False
    where = (_geometry(tensor), tensor.dtype, version_of(tensor))
    for entry in list(live.entries.values()):
        other = entry()
        if (
            other is not None
            and other is not tensor
            and storage_key(other) == key
            and (_geometry(other), other.dtype, version_of(other)) == where
        ):
            return True
    return False
