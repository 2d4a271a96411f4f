"""Where saved values live: the :class:`PayloadStore` protocol and the in-memory store.

Re-exported by :mod:`torchlens.trace`, whose records read their values through a store.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch

from torchlens._tensors import geometry_end, version_of, write_through
from torchlens.errors import PayloadUnavailableError

__all__ = ["MemoryPayloadStore", "PayloadStore", "Stored", "WrittenOver", "STRUCTURE_ONLY"]

# why a structure_only trace, captured or loaded, has no value: (code, message)
STRUCTURE_ONLY = (
    "structure_only",
    "this trace was captured with structure_only=True, so it holds no values; trace "
    "again without structure_only to read activations",
)


class PayloadStore(Protocol):
    """Where saved values live: in memory during capture, lazily on disk after ``tl.load``."""

    def get(self, label: str) -> torch.Tensor:
        """The saved value of ``label``; raises :class:`PayloadUnavailableError` if absent."""

    def has(self, label: str) -> bool:
        """Whether a value for ``label`` can be given."""


class Stored:
    """A record whose value lives in a store (its ``_store``): ops, sources and op views.

    The store is made apart from its records and attached later, by the capture, by io when
    it loads a trace, and by edits when it copies records; :attr:`store` is how they attach
    and read it without reaching into the record.
    """

    __slots__ = ()
    _store: PayloadStore | None

    @property
    def store(self) -> PayloadStore | None:
        """The store that holds this record's value (``out`` reads it); None when none is."""
        return self._store

    @store.setter
    def store(self, store: PayloadStore | None) -> None:
        self._store = store


class WrittenOver(NamedTuple):
    """A saved value kept as how to make it: the saved value ``stale`` with the saved values
    ``writes`` (``(label, region)``) copied over their regions in order, every geometry a
    ``(shape, stride, storage_offset)`` in one storage, the value's own being ``base``.

    The capture keeps a ``refresh`` this way when the writes it records account for every
    change of the tensor (see ``TraceBuilder._refresh``): a loop writing one channel of a
    large tensor at a time then keeps each write, not a copy of the whole tensor per step.
    """

    stale: str
    writes: tuple[tuple[str, tuple], ...]
    base: tuple


class MemoryPayloadStore:
    """Payloads held in memory, with the reason each missing one is missing.

    Values are detached tensors. ``versions`` holds each value's version counter at the time
    it was saved, so a value modified in place after capture is reported, never served.
    A value in ``written_over`` is made on its first read, and kept from then on.
    """

    def __init__(self, default_missing: tuple[str, str] | None = None) -> None:
        self.values: dict[str, torch.Tensor] = {}
        self.versions: dict[str, int] = {}
        self.missing: dict[str, tuple[str, str]] = {}  # label -> (code, message)
        self.default_missing = default_missing or ("not_saved", "no value was saved")
        # label -> the size of its storage when that held all of it (see _released)
        self._intact: dict[str, int] = {}
        self.written_over: dict[str, WrittenOver] = {}  # label -> how to make its value

    def get(self, label: str) -> torch.Tensor:
        value = self.values.get(label)
        if value is None and label in self.written_over:
            self._make(label)
            value = self.values.get(label)
        if value is None:
            code, message = self.missing.get(label, self.default_missing)
            raise PayloadUnavailableError(message, code=code)
        saved_version = self.versions.get(label)
        if saved_version is not None and version_of(value) != saved_version:
            raise PayloadUnavailableError(
                f"the value saved for {label!r} was modified in place after capture (an "
                "optimizer step on a parameter, an edit of a returned tensor); read the "
                "values you need before that, clone outputs before editing them, or trace "
                "again",
                code="payload_overwritten",
            )
        nbytes = _storage_bytes(value)  # the full test only when the size moved
        if nbytes != self._intact.get(label):
            if nbytes is not None and _released(value, nbytes):
                raise PayloadUnavailableError(
                    f"the memory of the value saved for {label!r} was released after "
                    "capture (FSDP frees its gathered parameters after each forward); keep "
                    "that memory (FSDP: fully_shard(..., reshard_after_forward=False)) and "
                    "trace again",
                    code="payload_released",
                )
            self._intact[label] = nbytes
        if value.requires_grad or type(value) is not torch.Tensor:  # kept undetached
            value = self.values[label] = value.detach()
        return value

    def has(self, label: str) -> bool:
        return label in self.values or label in self.written_over

    def set(self, label: str, value: torch.Tensor, version: int | None) -> None:
        """Keep ``value`` under ``label``; ``version`` is its version counter now, or None
        for a tensor without one (an inference tensor), which is then served unchecked."""
        self.written_over.pop(label, None)
        self.values[label] = value
        if version is not None:
            self.versions[label] = version
        else:
            self.versions.pop(label, None)

    def mark_missing(self, label: str, code: str, message: str) -> None:
        self.values.pop(label, None)
        self.written_over.pop(label, None)
        self.missing[label] = (code, message)

    def keep_written_over(self, label: str, recipe: WrittenOver) -> None:
        """Keep ``label``'s value as ``recipe`` (:class:`WrittenOver`) instead of a tensor."""
        self.values.pop(label, None)
        self.versions.pop(label, None)
        self.written_over[label] = recipe

    def recipe_of(self, label: str) -> WrittenOver | None:
        """How the value of ``label`` will be made (:class:`WrittenOver`), while it is not
        made yet; None once it is (it is then a saved value like any other)."""
        if label in self.values:  # (a value put in its place wins over the recipe)
            return None
        return self.written_over.get(label)

    def _make(self, label: str) -> None:
        """Make the value of ``label`` (kept :class:`WrittenOver`), and first those of the
        stale values it stands on that are kept so too, oldest first: a loop over channels
        makes a chain of them as long as the loop, too deep to recurse through."""
        chain = [label]
        while (stale := self.written_over[chain[-1]].stale) in self.written_over:
            chain.append(stale)
        for name in reversed(chain):
            recipe = self.written_over[name]
            try:
                stale = self.get(recipe.stale)
                writes = [(self.get(writer), region) for writer, region in recipe.writes]
            except PayloadUnavailableError as error:
                message = (
                    f"the value of {name!r} is made from saved values, and one of them is "
                    f"unavailable: {error}"
                )
                self.mark_missing(name, error.code, message)
                raise PayloadUnavailableError(message, code=error.code) from error
            value = write_through(stale, writes, recipe.base)
            self.set(name, value, version_of(value))


def _storage_bytes(value: torch.Tensor) -> int | None:
    """The size of ``value``'s storage in bytes; None without a plain storage."""
    try:
        return value.untyped_storage().nbytes()
    except Exception:  # noqa: BLE001 - sparse, nested, subclasses without storage
        return None


def _released(value: torch.Tensor, nbytes: int) -> bool:
    """Whether the storage under ``value``, of ``nbytes``, no longer reaches all of it: the
    memory was released (``untyped_storage().resize_(0)``, which moves no version
    counter); reading such a value would read freed memory."""
    if not value.numel() or value.dtype in _PACKED:  # several elements to a byte
        return False
    try:
        end = geometry_end((value.shape, value.stride(), value.storage_offset()))
    except Exception:  # noqa: BLE001 - symbolic sizes (a jagged nested tensor)
        return False
    return nbytes < end * value.element_size()


_PACKED = frozenset({torch.quint4x2, torch.quint2x4})
