"""The trace directory: which files it holds, and the marker that makes writing crash-safe.

A trace directory holds ``manifest.json``, ``rng.safetensors`` and its payloads
(``payloads.safetensors``, or one file per value under ``payloads/`` when streamed). Writing
starts by creating ``INCOMPLETE`` and ends by deleting it, after the manifest is in place, so
a save or a streamed capture that dies half-way leaves a directory that ``tl.load`` refuses
with code ``incomplete`` instead of reading a partial trace.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from torchlens.errors import TraceFileError

__all__ = [
    "MANIFEST",
    "MARKER",
    "PAYLOADS",
    "PAYLOAD_DIR",
    "RNG",
    "prepare",
    "finish",
    "write_tensors",
    "dumps",
    "inside",
]

MANIFEST = "manifest.json"
MARKER = "INCOMPLETE"
PAYLOADS = "payloads.safetensors"
PAYLOAD_DIR = "payloads"
RNG = "rng.safetensors"
GRADS = "grads.safetensors"  # present once backward ran through a save_grads=True trace
_OURS = (MANIFEST, MANIFEST + ".tmp", MARKER, PAYLOADS, RNG, GRADS)


def prepare(path: str | os.PathLike) -> Path:
    """Make ``path`` an empty trace directory marked incomplete, replacing an old trace.

    Raises:
        TraceFileError: ``path_exists`` when ``path`` is a file or a non-empty directory
            that is not a torchlens trace (nothing of the user's is ever deleted).
    """
    root = Path(path)
    if root.exists() and not root.is_dir():
        raise TraceFileError(
            f"{str(root)!r} is a file; save the trace to a directory path", code="path_exists"
        )
    root.mkdir(parents=True, exist_ok=True)
    names = {p.name for p in root.iterdir()}
    if names and not names & {MANIFEST, MARKER}:
        raise TraceFileError(
            f"{str(root)!r} is a non-empty directory that holds no torchlens trace; "
            "save to a new or empty directory",
            code="path_exists",
        )
    if names - {*_OURS, PAYLOAD_DIR}:
        raise TraceFileError(
            f"{str(root)!r} holds files torchlens did not write "
            f"({', '.join(sorted(names - {*_OURS, PAYLOAD_DIR}))}); save somewhere else",
            code="path_exists",
        )
    (root / MARKER).write_text("a torchlens trace is being written here\n")
    for name in _OURS:
        if name != MARKER:
            (root / name).unlink(missing_ok=True)
    if (root / PAYLOAD_DIR).is_dir():
        shutil.rmtree(root / PAYLOAD_DIR)
    return root


def finish(root: Path, manifest: dict[str, Any]) -> None:
    """Write the manifest atomically, then remove the incomplete marker."""
    tmp = root / (MANIFEST + ".tmp")
    tmp.write_text(dumps(manifest), encoding="utf-8")
    os.replace(tmp, root / MANIFEST)
    (root / MARKER).unlink()


def dumps(data: Any) -> str:
    """Deterministic JSON: sorted keys, ASCII, no NaN, one trailing newline."""
    return json.dumps(data, sort_keys=True, indent=1, ensure_ascii=True, allow_nan=False) + "\n"


def write_tensors(
    file: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None
) -> None:
    """Write ``tensors`` (contiguous, CPU) as one safetensors file; shared storage is copied,
    because safetensors refuses tensors that share memory."""
    seen: set[int] = set()
    unique = {}
    for key, tensor in tensors.items():
        ptr = tensor.untyped_storage().data_ptr() if tensor.numel() else None
        if ptr is not None and ptr in seen:
            tensor = tensor.clone()
        elif ptr is not None:
            seen.add(ptr)
        unique[key] = tensor
    save_file(unique, str(file), metadata=metadata)
    if os.name == "posix":  # safetensors writes 0600 files: follow the umask like the manifest
        os.chmod(file, 0o666 & ~_umask())


def _umask() -> int:
    """The process umask, read without changing it where Linux allows (threads may be
    creating files meanwhile); elsewhere set and restored at once."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def inside(root: Path, name: Any) -> Path:
    """``root / name`` if ``name`` is a plain relative path that stays inside ``root``.

    Raises:
        TraceFileError: ``unsafe_path`` for absolute paths, ``..``, or links leading out.
    """
    if not isinstance(name, str) or not name or "\\" in name or "\x00" in name:
        raise _unsafe(name)
    relative = Path(name)
    if relative.is_absolute() or ".." in relative.parts:
        raise _unsafe(name)
    target = root / relative
    if not target.resolve().is_relative_to(root.resolve()):
        raise _unsafe(name)
    return target


def _unsafe(name: Any) -> TraceFileError:
    return TraceFileError(
        f"the manifest names {name!r}, which is outside the trace directory; refusing to "
        "read it. Only load traces from sources you trust, or save the trace again",
        code="unsafe_path",
    )
