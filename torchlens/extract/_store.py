"""The extraction directory: a run record, safetensors shards, and a manifest at the end.

::

    run_dir/
      run.json                      the arguments the run was started with
      shards/shard-000000012.safetensors   one file per group of batches, written whole
      manifest.json                 written last: sites, shapes, dtypes, versions, row index

A shard holds, for each site, the rows of the batches it groups (concatenated), and in its
header the ``[batch, first row, size]`` of each batch. A shard is written to a temporary
name and renamed, so a killed run leaves whole shards or none: the batches in them are done,
the rest are run again. Nothing is ever pickled.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import time
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save as _to_bytes

from torchlens.errors import ExtractionError

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "TARGETS",
    "prepare",
    "done_batches",
    "ShardWriter",
    "finalize",
    "read_manifest",
]

FORMAT = "torchlens-extraction"
FORMAT_VERSION = 1
RUN, MANIFEST, SHARDS = "run.json", "manifest.json", "shards"
TARGETS = "__targets__"  # the shard key of the stored targets


def _dumps(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, indent=1)


def _write_file(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` whole: a temporary file, flushed, then renamed."""
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        full = " (the disk is full)" if err.errno == errno.ENOSPC else ""
        raise ExtractionError(
            f"could not write {path}{full}: {err}; the shards already written are intact: "
            "free space or fix the directory and rerun tl.extract with the same arguments",
            code="write_failed",
        ) from err


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ExtractionError(
            f"{path} is unreadable ({err}); it was not written by a finished tl.extract step: "
            "remove the directory or pass overwrite=True",
            code="corrupt",
        ) from None


def prepare(root: Path, args: dict[str, Any], overwrite: bool) -> None:
    """Check ``root`` against this run's ``args`` and make it ready to write (on rank 0 only:
    the other ranks wait for its outcome)."""
    if root.exists() and not root.is_dir():
        raise ExtractionError(
            f"{root} is a file, not an extraction directory; pass another to=",
            code="not_an_extraction",
        )
    run = root / RUN
    # another rank's run record may be half-written (a .tmp- file): that is not foreign
    foreign = root.exists() and any(not p.name.startswith(".tmp-") for p in root.iterdir())
    if foreign and not run.exists():
        raise ExtractionError(
            f"{root} is not empty and holds no extraction (no {RUN}); pass an empty or new "
            "directory as to=",
            code="not_an_extraction",
        )
    fresh = overwrite or not run.exists()
    if not fresh:
        before = _read_json(run).get("args", {})
        renamed = _label_named(before, args)
        if renamed and (root / MANIFEST).exists():
            raise ExtractionError(
                f"{root} holds a finished extraction, written by an older torchlens that "
                "named each module output by its op label (e.g. 'add_6'), not by the "
                "module's address: read it as it is with tl.load_extraction() (ex.meta "
                "['sites'] lists its names), or pass overwrite=True to extract it again "
                "with address names",
                code="exists",
            )
        if renamed and _shard_paths(root):
            raise ExtractionError(
                f"{root} holds an unfinished run started by an older torchlens, which named "
                "each module output by its op label (e.g. 'add_6'); this one names it by the "
                "module's address, so the shards cannot be continued: finish the run with the "
                "torchlens that started it, or pass overwrite=True to start over",
                code="args_changed",
            )
        if before != args and _shard_paths(root):
            raise ExtractionError(
                f"{root} holds a run started with other arguments: {_difference(before, args)}; "
                "rerun with the same arguments to resume it, or pass overwrite=True to start "
                "over",
                code="args_changed",
            )
        if (root / MANIFEST).exists():
            raise ExtractionError(
                f"{root} holds a finished extraction; read it with tl.load_extraction(), or "
                "pass overwrite=True to run it again",
                code="exists",
            )
        fresh = before != args  # a run that wrote nothing yet is simply started again
    if overwrite and run.exists():
        (root / MANIFEST).unlink(missing_ok=True)
        shutil.rmtree(root / SHARDS, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    if fresh:  # the run record first: it makes the directory ours
        record = {"format": FORMAT, "format_version": FORMAT_VERSION, "args": args}
        _write_file(run, _dumps(record).encode())
    (root / SHARDS).mkdir(exist_ok=True)


def _label_named(before: dict, now: dict) -> bool:
    """Whether the run on disk differs from this one only in naming module outputs by op
    label (run records written before ``site_names`` was added)."""
    return (
        "site_names" in now
        and "site_names" not in before
        and before == {k: v for k, v in now.items() if k != "site_names"}
    )


def _difference(before: dict, now: dict) -> str:
    keys = sorted(set(before) | set(now))
    return "; ".join(f"{k}: {before.get(k)} on disk, {now.get(k)} now"
                     for k in keys if before.get(k) != now.get(k))  # fmt: skip


def _shard_paths(root: Path) -> list[Path]:
    return sorted((root / SHARDS).glob("shard-*.safetensors"))


def _shard_header(path: Path) -> tuple[list[list[int]], dict[str, tuple[tuple[int, ...], str]]]:
    """A shard's ``[batch, start, size]`` list and ``{key: (per-example shape, dtype)}``, the
    keys in the order the model computed them (safetensors itself lists them sorted)."""
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata()
            batches = json.loads(metadata["batches"])
            names = sorted(f.keys())
            order = [k for k in json.loads(metadata.get("order", "[]")) if k in names]
            keys = {k: (tuple(f.get_slice(k).get_shape()[1:]), f.get_slice(k).get_dtype())
                    for k in order + [k for k in names if k not in order]}  # fmt: skip
    except Exception as err:  # safetensors raises its own error types for bad headers
        raise ExtractionError(
            f"shard {path} is unreadable ({err}); delete it and rerun tl.extract with the same "
            "arguments to redo its batches",
            code="corrupt",
        ) from None
    return batches, keys


def _sources(path: Path) -> dict[str, str]:
    """The op label each site named by module address came from (in the first batch)."""
    with safe_open(str(path), framework="pt") as f:
        return json.loads((f.metadata() or {}).get("sources", "{}"))


def disk_site_keys(root: Path) -> dict[str, tuple] | None:
    """The identity key (``extract/_identity.py``) of each site named by op label, as the
    first shard on disk noted it; None without shards, or shards that noted none."""
    paths = _shard_paths(root)
    if not paths:
        return None
    with safe_open(str(paths[0]), framework="pt") as f:
        noted = (f.metadata() or {}).get("site_keys")
    if noted is None:
        return None
    return {
        name: (k[0], tuple((a, c) for a, c in k[1]), *k[2:])
        for name, k in json.loads(noted).items()
    }


def done_batches(root: Path) -> set[int]:
    """Batches already written to a shard (by any rank, in this run or an earlier one)."""
    return set(done_sizes(root))


def done_sizes(root: Path) -> dict[int, int]:
    """``{batch: examples in it}`` of the batches already written to a shard."""
    return {b: size for path in _shard_paths(root) for b, _, size in _shard_header(path)[0]}


def disk_schema(root: Path) -> dict[str, tuple[tuple[int, ...], str]] | None:
    """``{key: (per-example shape, dtype)}`` of the first shard on disk, if any."""
    paths = _shard_paths(root)
    return _shard_header(paths[0])[1] if paths else None


class ShardWriter:
    """Collects batches and writes them as one shard once ``limit`` bytes are buffered, or
    once the oldest batch held has waited ``every`` seconds (``None``: by size only), so a
    killed run loses at most that long of work.

    ``writing`` wraps each write (a signal must not cut one in half: the rows taken out of
    the buffer would be lost); ``sources`` maps sites named by module address to the op
    label they came from, and ``site_keys`` each site named by label to its op's key (so a
    resumed run follows the same ops), noted in each shard.
    """

    def __init__(
        self,
        root: Path,
        limit: int,
        every: float | None = None,
        writing: Callable[[], ContextManager[Any]] = nullcontext,
    ) -> None:
        self.root, self.limit, self.every, self.writing = root, limit, every, writing
        self.parts: dict[str, list[torch.Tensor]] = {}
        self.batches: list[list[int]] = []
        self.nbytes = 0
        self.since = 0.0  # when the oldest batch held was added
        self.sources: dict[str, str] = {}
        self.site_keys: dict[str, tuple] = {}  # site named by label -> its op's key

    def add(self, index: int, start: int, size: int, values: dict[str, torch.Tensor]) -> None:
        """Hold one batch's rows (whole: a signal waits, so no site holds a row more than
        another), and write the shard when it is due."""
        now = time.monotonic()
        with self.writing():
            if not self.batches:
                self.since = now
            for key, value in values.items():
                self.parts.setdefault(key, []).append(value)
                self.nbytes += value.numel() * value.element_size()
            self.batches.append([index, start, size])
            due = self.every is not None and now - self.since >= self.every
            if self.nbytes >= self.limit or due:
                self.flush()

    def flush(self) -> None:
        if not self.batches:
            return
        with self.writing():  # a signal now waits: the rows are out of the buffer
            parts, batches = self.parts, self.batches
            self.parts, self.batches, self.nbytes = {}, [], 0
            # each site's parts freed as soon as they are joined
            tensors = {key: torch.cat(parts.pop(key)).contiguous() for key in list(parts)}
            metadata = {"batches": json.dumps(batches), "order": json.dumps(list(tensors))}
            if self.sources:
                metadata["sources"] = json.dumps(self.sources)
            metadata["site_keys"] = json.dumps(self.site_keys)
            data = _to_bytes(tensors, metadata=metadata)
            del tensors
            _write_file(self.root / SHARDS / f"shard-{batches[0][0]:09d}.safetensors", data)


def finalize(root: Path, n_batches: int, n_examples: int, meta: dict[str, Any]) -> None:
    """Check that the shards hold every batch exactly once with one schema, then write the
    manifest that marks the run finished."""
    shards, seen, schema, first = [], {}, None, None
    for path in _shard_paths(root):
        batches, here = _shard_header(path)
        if schema is None:
            schema, first = here, (path, batches)
        elif here != schema:
            raise _mixed(first, schema, (path, batches), here)
        rows, offset = [], 0
        for b, start, size in batches:
            seen[b] = (start, size)
            rows.append([start, start + size, offset])
            offset += size
        shards.append({"file": f"{SHARDS}/{path.name}", "rows": _merge(rows)})
    missing = sorted(set(range(n_batches)) - set(seen))
    if missing or len(seen) != n_batches:
        raise ExtractionError(
            f"{root}: batches {missing[:10]} of {n_batches} are not on disk; rerun tl.extract "
            "with the same arguments to finish",
            code="incomplete",
        )
    schema = schema or {}
    sites = {k: {"shape": [n_examples, *s], "dtype": d} for k, (s, d) in schema.items()}
    targets = sites.pop(TARGETS, None)
    record = {"format": FORMAT, "format_version": FORMAT_VERSION, "complete": True,
              "n_examples": n_examples, "n_batches": n_batches, "sites": sites,
              "site_order": list(sites), "targets": targets, "shards": shards,
              "site_ops": _sources(first[0]) if first else {}, **meta}  # fmt: skip
    _write_file(root / MANIFEST, _dumps(record).encode())
    for tmp in (root / SHARDS).glob(".tmp-*"):  # left by killed processes
        tmp.unlink(missing_ok=True)


def _mixed(first: tuple, schema: dict, other: tuple, here: dict) -> ExtractionError:
    """Two shards whose sites differ: batches that different ranks ran (each rank compares
    only its own batches), or shards left by an earlier selection."""
    (path_a, batches_a), (path_b, batches_b) = first, other
    where_a = f"batches {_some([b for b, _, _ in batches_a])} ({path_a.name})"
    where_b = f"batches {_some([b for b, _, _ in batches_b])} ({path_b.name})"
    if set(here) != set(schema):
        return ExtractionError(
            f"{where_b} gave sites {sorted(here)} but {where_a} gave {sorted(schema)}; select "
            "sites every batch reaches, and pass overwrite=True to start over",
            code="sites_changed",
        )
    key = next(k for k in schema if here[k] != schema[k])
    name = "targets=" if key == TARGETS else key
    (shape, dtype), (old_shape, old_dtype) = here[key], schema[key]
    return ExtractionError(
        f"site {name!r} has per-example shape {shape} ({dtype}) in {where_b} but {old_shape} "
        f"({old_dtype}) in {where_a}; pass reduce='token_mean' (or another reduction) for a "
        "fixed shape, or pad the batches to one length, and pass overwrite=True to start over",
        code="shape_changed",
    )


def _some(batches: list[int]) -> str:
    return str(batches) if len(batches) <= 8 else f"{str(batches[:8])[:-1]}, ...]"


def _merge(rows: list[list[int]]) -> list[list[int]]:
    """Join row ranges that continue each other (in the shard and in the dataset)."""
    merged: list[list[int]] = []
    for start, stop, offset in rows:
        last = merged[-1] if merged else None
        if last and last[1] == start and last[2] + (last[1] - last[0]) == offset:
            last[1] = stop
        else:
            merged.append([start, stop, offset])
    return merged


def read_manifest(root: Path) -> dict[str, Any]:
    """The manifest of a finished run, checked for format and version."""
    if not root.is_dir() or not ((root / MANIFEST).exists() or (root / RUN).exists()):
        raise ExtractionError(
            f"{root} is not a tl.extract directory (no {MANIFEST}); pass the to= of a run",
            code="not_an_extraction",
        )
    if not (root / MANIFEST).exists():
        raise ExtractionError(
            f"the extraction in {root} did not finish; rerun tl.extract with the same "
            "arguments to complete it",
            code="incomplete",
        )
    manifest = _read_json(root / MANIFEST)
    if manifest.get("format") != FORMAT or manifest.get("format_version") != FORMAT_VERSION:
        raise ExtractionError(
            f"{root / MANIFEST} is format {manifest.get('format')!r} version "
            f"{manifest.get('format_version')!r}; this torchlens reads {FORMAT!r} version "
            f"{FORMAT_VERSION}: use the torchlens that wrote it, or extract again",
            code="corrupt",
        )
    return manifest
