"""``tl.load``: read a trace directory back into a Trace whose values load lazily.

Loading checks everything it can without reading the values: the marker, the manifest's
format and version, that every file it names stays inside the directory, and that each
payload file's safetensors header lists the expected tensors. The values themselves are
read (and checked against their SHA-256) on first access. Nothing in the files is executed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from torchlens._store import STRUCTURE_ONLY
from torchlens.errors import TraceFileError
from torchlens.io import _layout
from torchlens.io._encode import Unencodable
from torchlens.io._grads import LoadedGrads, read_grads
from torchlens.io._manifest import (
    FORMAT,
    FORMAT_VERSION,
    manifest_to_trace,
    output_from_manifest,
)
from torchlens.io._payloads import FilePayloadStore
from torchlens.trace import Trace

__all__ = ["load"]

_PAYLOAD_KEYS = {"complex", "dtype", "file", "key", "sha256", "shape"}


def load(path: str | os.PathLike) -> Trace:
    """Read a trace saved by ``tl.save`` or ``tl.trace(..., stream_to=...)``.

    Labels, edges, module calls, metadata and replay information come back as saved; values
    are read from disk when first used (``op.out``), as CPU tensors bit-identical to the
    saved ones. Functions are found again by name in torch's own namespaces only.

    Args:
        path: the trace directory.

    Returns:
        The :class:`~torchlens.trace.Trace`.

    Raises:
        TraceFileError: with code ``not_a_trace``, ``incomplete``, ``corrupt_manifest``,
            ``corrupt_payload``, ``format_version`` or ``unsafe_path``.

    Example:
        >>> import tempfile, torch, torchlens as tl
        >>> trace = tl.trace(torch.nn.Linear(4, 2), torch.randn(1, 4))
        >>> loaded = tl.load(tl.save(trace, tempfile.mkdtemp() + "/trace"))
        >>> loaded.labels, torch.equal(loaded["linear_1"].out, trace["linear_1"].out)
        (['linear_1'], True)
    """
    root = Path(path)
    data = _read_manifest(root)
    payloads = _check_payloads(root, data)
    structure_only = bool(isinstance(data.get("meta"), dict) and data["meta"].get("structure_only"))
    store = FilePayloadStore(
        root,
        payloads,
        missing=_missing(data),
        default_missing=STRUCTURE_ONLY if structure_only else None,
    )
    rng = _read_rng(root)
    try:
        output, reason = output_from_manifest(data, store)
        trace = manifest_to_trace(data, store, rng, output)
    except (KeyError, TypeError, ValueError, Unencodable) as err:
        raise _corrupt_manifest(root, f"{type(err).__name__}: {err}") from None
    if reason is not None:
        trace.meta["output_unavailable"] = reason
    grads = read_grads(root, {r.label for r in (*trace.ops, *trace.sources)})
    if grads is not None:
        for record in (*trace.ops, *trace.sources):
            record.grad_store = grads
        trace.grad_session = LoadedGrads(grads)
    return trace


def _read_manifest(root: Path) -> dict[str, Any]:
    if not root.is_dir():
        raise TraceFileError(
            f"{str(root)!r} is not a directory; pass the folder tl.save wrote",
            code="not_a_trace",
        )
    if (root / _layout.MARKER).exists():
        raise TraceFileError(
            f"the trace in {str(root)!r} was never finished (its save or streamed capture "
            "stopped half-way); trace and save it again",
            code="incomplete",
        )
    file = root / _layout.MANIFEST
    if not file.is_file():
        ours = any((root / name).exists() for name in (_layout.PAYLOADS, _layout.RNG))
        if ours:
            raise _corrupt_manifest(root, "manifest.json is missing")
        raise TraceFileError(
            f"{str(root)!r} holds no torchlens trace (no manifest.json); pass the folder "
            "tl.save wrote",
            code="not_a_trace",
        )
    try:
        data = json.loads(file.read_text(encoding="utf-8"), parse_constant=_no_constants)
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise _corrupt_manifest(root, f"not valid JSON: {err}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise TraceFileError(
            f"{str(file)!r} is not a torchlens trace manifest; pass the folder tl.save wrote",
            code="not_a_trace",
        )
    version = data.get("format_version")
    if version != FORMAT_VERSION:
        raise TraceFileError(
            f"the trace in {str(root)!r} has format version {version!r}, but this torchlens "
            f"reads version {FORMAT_VERSION}; load it with the torchlens that wrote it "
            f"({data.get('torchlens_version')!r}) and save it again",
            code="format_version",
        )
    return data


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not allowed in a manifest")


def _check_payloads(root: Path, data: dict[str, Any]) -> dict[str, dict]:
    payloads = data.get("payloads")
    if not isinstance(payloads, dict):
        raise _corrupt_manifest(root, "'payloads' is not an object")
    by_file: dict[str, dict[str, dict]] = {}
    for label, entry in payloads.items():
        if not _valid_entry(entry):
            raise _corrupt_manifest(root, f"bad payload entry for {label!r}")
        _layout.inside(root, entry["file"])
        by_file.setdefault(entry["file"], {})[entry["key"]] = entry
    for file, keys in by_file.items():
        _check_header(root, file, keys)
    return payloads


def _valid_entry(entry: Any) -> bool:
    return (
        isinstance(entry, dict)
        and set(entry) - {"quantized"} == _PAYLOAD_KEYS
        and isinstance(entry.get("quantized", {}), dict)
        and isinstance(entry["complex"], bool)
        and all(isinstance(entry[k], str) for k in ("dtype", "file", "key", "sha256"))
        and isinstance(entry["shape"], list)
        and all(type(n) is int for n in entry["shape"])
    )


def _check_header(root: Path, file: str, keys: dict[str, dict]) -> None:
    target = _layout.inside(root, file)
    try:
        with safe_open(str(target), framework="pt", device="cpu") as handle:
            present = set(handle.keys())
            for key, entry in keys.items():
                if key not in present:
                    raise _corrupt_payload(file, f"{key!r} is not in it")
                shape = list(handle.get_slice(key).get_shape())  # complex: a real view (..., 2)
                if shape != ([*entry["shape"], 2] if entry["complex"] else entry["shape"]):
                    raise _corrupt_payload(file, f"{key!r} has shape {shape}")
    except TraceFileError:
        raise
    except (SafetensorError, OSError) as err:
        raise _corrupt_payload(file, str(err)) from None


def _read_rng(root: Path) -> dict[str, torch.Tensor]:
    file = root / _layout.RNG
    try:
        with safe_open(str(file), framework="pt", device="cpu") as handle:
            return {key: handle.get_tensor(key) for key in handle.keys()}
    except (SafetensorError, OSError) as err:
        raise _corrupt_payload(_layout.RNG, str(err)) from None


def _missing(data: dict[str, Any]) -> dict[str, tuple[str, str]]:
    missing = data.get("missing")
    if not isinstance(missing, dict) or not all(
        isinstance(v, list) and len(v) == 2 and all(isinstance(s, str) for s in v)
        for v in missing.values()
    ):
        raise TraceFileError("the manifest's 'missing' table is malformed", code="corrupt_manifest")
    return {label: (code, message) for label, (code, message) in missing.items()}


def _corrupt_manifest(root: Path, detail: str) -> TraceFileError:
    return TraceFileError(
        f"the manifest of {str(root)!r} is damaged ({detail}); save the trace again",
        code="corrupt_manifest",
    )


def _corrupt_payload(file: str, detail: str) -> TraceFileError:
    return TraceFileError(
        f"payload file {file!r} is damaged or missing ({detail}); save the trace again",
        code="corrupt_payload",
    )
