"""The values a capture keeps, for ``tl.trace`` (every op's) and ``tl.record`` (those
``save=`` selects) alike: each the tensor itself, an alias, copied only just before
something writes into its storage (:meth:`PayloadKeeper.protect`), so a kept value is
always the value at the time it was produced; or a copy at once where the tensor has no
plain storage, or where the caller asks for one; or handed to a sink as produced."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from torchlens._store import WrittenOver
from torchlens._tensors import dense, storage_address, storage_key, version_of
from torchlens._tensors import geometry as _geometry
from torchlens.capture.alias_copies import copies_before_write
from torchlens.capture.sinks import PayloadSink
from torchlens.trace import MemoryPayloadStore

__all__ = ["PayloadKeeper", "ASK"]

Tensor = torch.Tensor
_KEPT_AS_IS = frozenset({Tensor, nn.Parameter})  # kept undetached; see save
ASK: Any = object()  # a version the keeper reads itself (the caller has not read it)


class PayloadKeeper:
    """Keeps values by label in ``store`` (a sink's, when one is given).

    Args:
        store: the capture's in-memory store.
        sink: a :class:`~torchlens.capture.sinks.PayloadSink` that takes each value as it
            is produced (streaming capture); values then never stay in memory.
    """

    __slots__ = ("store", "values", "versions", "sink", "aliases", "recipes")

    def __init__(self, store: MemoryPayloadStore, sink: PayloadSink | None = None) -> None:
        self.values, self.versions = store.values, store.versions
        self.sink = sink
        self.store = store if sink is None else sink.attach(store)
        # storage -> the labels of the kept aliases of it: one label, or a list of them
        self.aliases: dict[int, str | list[str]] = {}
        # label -> how to make its value from kept ones (a refresh whose recorded writes
        # account for every change): protect keeps it so instead of copying it
        self.recipes: dict[str, WrittenOver] = {}

    def save(self, label: str, tensor: Tensor, copy: bool = False, version: Any = ASK) -> None:
        """Keep ``tensor``'s value under ``label``: an alias, or a copy now (``copy``).
        ``version`` is passed where the caller has read it already."""
        if self.sink is not None:  # written now, so later in-place writes cannot reach it
            self.sink.put(label, tensor.detach())
            return
        # the tensor itself, detached when first read (MemoryPayloadStore.get): detaching
        # makes an alias object, the dearest step of keeping a value, and a graph the
        # tensor holds is held by the model's output anyway
        value = tensor if type(tensor) in _KEPT_AS_IS else tensor.detach()
        key = None
        if not copy:
            try:  # storage_key inline (the per-op path)
                key = storage_address(value)
            except (RuntimeError, NotImplementedError):  # no plain storage: copied
                pass
        if key is None:
            value = tensor.detach().clone()
            version = version_of(value)
        else:
            aliases = self.aliases.get(key)
            if aliases is None:  # the common case: a fresh storage, no list made for it
                self.aliases[key] = label
            elif type(aliases) is str:
                self.aliases[key] = [aliases, label]
            else:
                aliases.append(label)
            if version is ASK:  # an alias shares the tensor's version counter
                version = version_of(value)
        self.values[label] = value  # MemoryPayloadStore.set inline (the per-op path)
        if version is not None:
            self.versions[label] = version
        elif label in self.versions:  # a copy without a version replaced a versioned alias
            del self.versions[label]

    def protect(self, target: Tensor) -> None:
        """Copy every kept alias of ``target``'s storage before it is written in place.

        Aliases of one memory are copied together (:func:`copies_before_write`), so
        memory they shared in the forward is copied once.
        """
        key = storage_key(target)
        if key is None:
            return
        aliases = self.aliases.pop(key, ())
        if not aliases:  # (the usual write: into memory no kept value shares)
            return
        values, versions, recipes = self.values, self.versions, self.recipes
        intact = []  # (label, value) of the aliases still holding their kept value
        for label in (aliases,) if type(aliases) is str else aliases:
            value = values.get(label)
            # a value a write out of sight overwrote already (inside a TorchScript
            # function) stays as it is: the store reports it, a copy would vouch for it
            if value is not None and version_of(value) == versions.get(label):
                recipe = recipes.pop(label, None) if recipes else None
                if recipe is not None:  # the writes over the stale value: no copy
                    self.store.keep_written_over(label, recipe)
                else:
                    intact.append((label, value))
        for label, copy in copies_before_write(intact):
            if copy is None:  # quint4x2 cannot be copied
                self.store.mark_missing(
                    label, "payload_overwritten",
                    f"the value saved for {label!r} was written in place during the "
                    f"forward, and {values[label].dtype} values cannot be copied before that",
                )  # fmt: skip
                continue
            self.store.set(label, copy, version_of(copy))

    def keep_as_writes(
        self, label: str, tensor: Tensor, stale: str, writes: list[tuple[str, Any]], base: Any
    ) -> None:
        """Keep the value of ``label``, a refresh of ``tensor`` whose recorded ``writes``
        (``(label, region)``) over the value ``stale`` account for every change, as that
        recipe when every value it needs is kept and intact: :meth:`protect` then keeps
        it so instead of copying it (``base``: the refresh's own geometry)."""
        if (
            label not in self.values
            or base is None
            or not dense(base)
            or tensor.layout is not torch.strided
            or tensor.is_quantized
            or tensor.is_conj()
            or tensor.is_neg()
        ):
            return
        values, versions = self.values, self.versions

        def intact(kept: str) -> bool:  # saved, of the tensor's dtype, unwritten since
            value = values.get(kept)
            return (
                value is not None
                and value.dtype == tensor.dtype
                and versions.get(kept, ASK) == version_of(value)
            )

        # stale: kept as writes itself (the previous step of the same loop), or intact
        if (stale in self.store.written_over or intact(stale)) and all(
            region is not None and intact(writer) for writer, region in writes
        ):
            self.recipes[label] = WrittenOver(stale, tuple(writes), base)

    def same_memory(self, tensor: Tensor) -> str | None:
        """The label of a kept value that ``tensor``, an object not seen before, is: the
        same memory, layout, dtype and version. ``Tensor.as_subclass`` (torchvision's
        tv_tensors) makes such objects out of the capture's sight."""
        key = storage_key(tensor)
        aliases = self.aliases.get(key) if key is not None else None
        if not aliases:
            return None
        geometry, version = _geometry(tensor), version_of(tensor)
        for label in reversed((aliases,) if type(aliases) is str else aliases):
            value = self.values.get(label)
            if (
                value is not None
                and value.dtype == tensor.dtype
                and self.versions.get(label) == version
                and _geometry(value) == geometry
            ):
                return label
        return None
