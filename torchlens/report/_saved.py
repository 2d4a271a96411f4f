"""What a saved trace directory holds, in a few lines: ``torchlens info DIR``."""

from __future__ import annotations

import json
import os
from pathlib import Path

from torchlens._table import format_table
from torchlens.io import load

__all__ = ["trace_info"]


def trace_info(path: str | os.PathLike) -> str:
    """A short report of the saved trace at ``path``: model, versions, counts, what was kept.

    Nothing in the directory is run and no value is read; the payloads stay on disk.

    Args:
        path: a directory written by ``tl.save``, ``trace.save`` or ``stream_to=``.

    Returns:
        The report as text, one ``field  value`` row per line.

    Raises:
        TraceFileError: the directory is not a complete, readable torchlens trace (codes as
            for :func:`torchlens.load`).

    Example:
        >>> import tempfile, torch, torchlens as tl
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
        >>> saved = tl.trace(model, torch.randn(2, 4)).save(tempfile.mkdtemp() + "/run")
        >>> [line.split() for line in trace_info(saved).splitlines()[4:6]]
        [['model', 'Sequential'], ['mode', 'train']]
    """
    root = Path(path)
    trace = load(root)
    manifest = json.loads((root / "manifest.json").read_text(encoding="utf-8"))
    meta = trace.meta
    saved = f"{sum(op.has_out for op in trace.ops)} of {len(trace.ops)} ops"
    if trace.structure_only:
        saved = "none (structure_only=True)"
    files = [p for p in root.rglob("*") if p.is_file()]
    rows = [
        ("directory", str(root)),
        ("format", f"{manifest.get('format')} version {manifest.get('format_version')}"),
        ("model", str(meta.get("model_type", "-"))),
        ("mode", "train" if meta.get("training") else "eval"),
        ("torch", str(meta.get("torch_version", "-"))),
        ("torchlens", str(meta.get("torchlens_version", "-"))),
        ("ops", str(len(trace.ops))),
        ("sources", f"{len(trace.sources)} ({len(trace.inputs)} inputs)"),
        ("module calls", str(len(trace.modules))),
        ("outputs", ", ".join(trace.output_labels) or "-"),
        ("values saved", saved),
        ("gradients", "saved" if (root / "grads.safetensors").exists() else "none"),
        ("halted", f"after {meta.get('halted_at')}" if trace.halted else "no"),
        ("on disk", f"{len(files)} files, {_bytes_text(sum(p.stat().st_size for p in files))}"),
    ]
    return format_table(("field", "value"), rows)


def _bytes_text(size: int) -> str:
    for scale, unit in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} bytes"
