"""``tl.save``: write a finished Trace to a directory (manifest + safetensors payloads)."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from torchlens.errors import InvalidArgumentError, PayloadUnavailableError, TraceFileError
from torchlens.io import _layout
from torchlens.io._grads import write_grads
from torchlens.io._manifest import rng_tensors, trace_to_manifest
from torchlens.io._payloads import FilePayloadStore, entry_for, stored_form
from torchlens.trace import Trace

__all__ = ["save", "collect_payloads"]


def save(trace: Trace, path: str | os.PathLike) -> Path:
    """Write ``trace`` to the directory ``path``; the same trace always gives the same bytes.

    The directory gets ``manifest.json`` (sorted-key JSON: graph, op metadata, module calls,
    argument templates, versions), ``payloads.safetensors`` (saved values) and
    ``rng.safetensors`` (RNG snapshots for replay). Nothing is pickled. An older trace at
    ``path`` is replaced.

    Args:
        trace: a trace from ``tl.trace`` or ``tl.load``.
        path: the directory to write; created if needed.

    Returns:
        The directory, as a :class:`~pathlib.Path`.

    Raises:
        TraceFileError: ``path_exists`` when ``path`` is a file, a directory holding other
            files, or the directory the trace itself is being read from.

    Example:
        >>> import tempfile, torch, torchlens as tl
        >>> trace = tl.trace(torch.nn.Linear(4, 2), torch.randn(1, 4))
        >>> folder = tl.save(trace, tempfile.mkdtemp() + "/trace")
        >>> sorted(p.name for p in folder.iterdir())
        ['manifest.json', 'payloads.safetensors', 'rng.safetensors']
    """
    if not isinstance(trace, Trace):
        raise InvalidArgumentError(
            f"save() takes a Trace (from tl.trace or tl.load), got {type(trace).__name__}",
            code="not_a_trace",
        )
    store = trace.store
    if isinstance(store, FilePayloadStore) and _same_dir(store.root, Path(path)):
        raise TraceFileError(
            f"this trace reads its values from {str(path)!r}; save it somewhere else",
            code="path_exists",
        )
    stored, entries, missing = collect_payloads(trace, _layout.PAYLOADS)
    root = _layout.prepare(path)
    _layout.write_tensors(root / _layout.PAYLOADS, stored)
    _layout.write_tensors(root / _layout.RNG, rng_tensors(trace))
    grads = dict(trace.grads) if trace.grad_session is not None else {}  # backward capture's
    if grads:
        write_grads(root, grads)
    _layout.finish(root, trace_to_manifest(trace, entries, missing))
    return root


def collect_payloads(
    trace: Trace, file: str
) -> tuple[dict[str, torch.Tensor], dict[str, dict], dict[str, tuple[str, str]]]:
    """The stored form of every readable value, their manifest entries, and the reason each
    unreadable one is missing (structure-only traces list none: the reason is implied)."""
    stored: dict[str, torch.Tensor] = {}
    entries: dict[str, dict] = {}
    missing: dict[str, tuple[str, str]] = {}
    if trace.structure_only:
        return stored, entries, missing
    for record in [*trace.sources, *trace.ops]:
        label = record.label
        try:
            value = trace.store.get(label)
        except PayloadUnavailableError as err:
            missing[label] = (err.code, str(err))
            continue
        try:
            stored[label] = stored_form(value)
        except ValueError as err:
            missing[label] = ("not_saved", f"the value of {label!r} cannot be saved: {err}")
            continue
        entries[label] = entry_for(value, stored[label], file, label)
    return stored, entries, missing


def _same_dir(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False
