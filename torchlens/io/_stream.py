"""The streaming writer behind ``tl.trace(model, x, stream_to=path)``.

Each value goes to its own safetensors file under ``payloads/`` the moment the capture
produces it, and is not kept: memory holds at most one value being written. The directory is
marked ``INCOMPLETE`` until :meth:`StreamWriter.close` writes the manifest, so a forward that
raises leaves a directory ``tl.load`` refuses with code ``incomplete``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch

from torchlens.io import _layout
from torchlens.io._grads import write_grads
from torchlens.io._manifest import rng_tensors, trace_to_manifest
from torchlens.io._payloads import FilePayloadStore, entry_for, stored_form
from torchlens.trace import MemoryPayloadStore, Trace

__all__ = ["StreamWriter"]


class StreamWriter:
    """A :class:`~torchlens.capture.sinks.PayloadSink` writing values to a trace directory.

    Args:
        path: the directory; created, or an older trace there replaced.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.root = _layout.prepare(path)
        (self.root / _layout.PAYLOAD_DIR).mkdir()
        self.store: FilePayloadStore | None = None
        self._count = 0

    def attach(self, store: MemoryPayloadStore) -> FilePayloadStore:
        self.store = FilePayloadStore(
            self.root, {}, missing=store.missing, default_missing=store.default_missing
        )
        return self.store

    def put(self, label: str, value: torch.Tensor) -> None:
        assert self.store is not None, "attach() comes first"
        try:
            stored = stored_form(value)
        except ValueError as err:
            self.store.mark_missing(label, "not_saved", f"{label!r} cannot be saved: {err}")
            return
        self._count += 1
        file = f"{_layout.PAYLOAD_DIR}/{self._count:06d}.safetensors"
        _layout.write_tensors(self.root / file, {label: stored})
        self.store.entries[label] = entry_for(value, stored, file, label)

    def write_grads(self, grads: Mapping[str, torch.Tensor]) -> None:
        """Write the gradients of a finished backward beside the streamed trace."""
        write_grads(self.root, grads)

    def close(self, trace: Trace) -> None:
        assert self.store is not None, "attach() comes first"
        _layout.write_tensors(self.root / _layout.RNG, rng_tensors(trace))
        entries = dict(sorted(self.store.entries.items()))
        _layout.finish(self.root, trace_to_manifest(trace, entries, self.store.missing))
