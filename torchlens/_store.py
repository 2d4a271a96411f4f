"""Where saved values live: the :class:`PayloadStore` protocol and the in-memory store.

Re-exported by :mod:`torchlens.trace`, whose records read their values through a store.
"""

from __future__ import annotations

from typing import Protocol

import torch

from torchlens._tensors import geometry_end, version_of
from torchlens.errors import PayloadUnavailableError

__all__ = ["MemoryPayloadStore", "PayloadStore"]


class PayloadStore(Protocol):
    """Where saved values live: in memory during capture, lazily on disk after ``tl.load``."""

    def get(self, label: str) -> torch.Tensor:
        """The saved value of ``label``; raises :class:`PayloadUnavailableError` if absent."""

    def has(self, label: str) -> bool:
        """Whether a value for ``label`` can be given."""


class MemoryPayloadStore:
    """Payloads held in memory, with the reason each missing one is missing.

    Values are detached tensors. ``versions`` holds each value's version counter at the time
    it was saved, so a value modified in place after capture is reported, never served.
    """

    def __init__(self, default_missing: tuple[str, str] | None = None) -> None:
        self.values: dict[str, torch.Tensor] = {}
        self.versions: dict[str, int] = {}
        self.missing: dict[str, tuple[str, str]] = {}  # label -> (code, message)
        self.default_missing = default_missing or ("not_saved", "no value was saved")
        # label -> the size of its storage when that held all of it (see _released)
        self._intact: dict[str, int] = {}

    def get(self, label: str) -> torch.Tensor:
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
        return label in self.values

    def set(self, label: str, value: torch.Tensor, version: int | None) -> None:
        """Keep ``value`` under ``label``; ``version`` is its version counter now, or None
        for a tensor without one (an inference tensor), which is then served unchecked."""
        self.values[label] = value
        if version is not None:
            self.versions[label] = version
        else:
            self.versions.pop(label, None)

    def mark_missing(self, label: str, code: str, message: str) -> None:
        self.values.pop(label, None)
        self.missing[label] = (code, message)


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
