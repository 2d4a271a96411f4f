"""Payload sinks: where a capture sends each saved value instead of keeping it in memory.

By default the :class:`~torchlens.capture.builder.TraceBuilder` keeps values in a
:class:`~torchlens.trace.MemoryPayloadStore`. A sink takes them as they are produced
(``tl.trace(..., stream_to=path)`` writes each one to disk at once) and hands back a store that
reads them again. Capture defines the protocol; ``torchlens.io`` provides the disk sink and
registers it here when imported, so capture never imports io (lower layers never import
upward). The seam is injection rather than a lazy import so the layering stays checkable by
reading imports.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Protocol

import torch

from torchlens.errors import InvalidArgumentError
from torchlens.trace import MemoryPayloadStore, PayloadStore, Trace

__all__ = ["PayloadSink", "register_stream_sink", "open_stream_sink"]


class PayloadSink(Protocol):
    """Receives each saved value of a capture as soon as it is produced."""

    def attach(self, store: MemoryPayloadStore) -> PayloadStore:
        """The store ops will read from; ``store`` holds the reasons values are missing
        (its ``default_missing`` and later ``mark_missing`` calls) and must be honoured."""

    def put(self, label: str, value: torch.Tensor) -> None:
        """Keep ``value`` (a detached tensor, valid only during this call) for ``label``."""

    def close(self, trace: Trace) -> None:
        """The capture finished: make what was written complete and readable."""

    def write_grads(self, grads: Mapping[str, torch.Tensor]) -> None:
        """Backward ran through the trace (``save_grads=True``): keep its gradients too."""


StreamSinkFactory = Callable[[str | os.PathLike], PayloadSink]
_factory: list[StreamSinkFactory] = []


def register_stream_sink(factory: StreamSinkFactory) -> None:
    """Make ``factory(path)`` the sink behind ``tl.trace(..., stream_to=path)``."""
    _factory[:] = [factory]


def open_stream_sink(path: str | os.PathLike) -> PayloadSink:
    """A new sink writing to ``path``, from the registered factory.

    Raises:
        InvalidArgumentError: ``streaming_unavailable`` when no writer is registered (only
            possible if ``torchlens.io`` failed to import).
    """
    if not _factory:
        raise InvalidArgumentError(
            "stream_to= needs torchlens.io, which is not loaded; import torchlens.io first",
            code="streaming_unavailable",
        )
    return _factory[0](path)
