"""Reading a finished extraction back: lazy per-site arrays and a ``Dataset`` view."""

from __future__ import annotations

import bisect
import os
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from torch.utils.data import Dataset

from torchlens.errors import ExtractionError, LookupFailedError
from torchlens.extract._sites import SAFETENSORS_DTYPES
from torchlens.extract._store import TARGETS, read_manifest

__all__ = ["Extraction", "SiteArray", "load_extraction"]

_DTYPES = {name: dtype for dtype, name in SAFETENSORS_DTYPES.items()}  # "F32" -> torch.float32
_OPEN_LIMIT = 64  # shard files held open (memory-mapped) at once
_GAP = 16  # rows asked for this close together are read in one slice


class _Shards:
    """The run's shard files, opened lazily and kept open (a bounded number at a time)."""

    def __init__(self, root: Path, shards: list[dict]) -> None:
        self.root = root
        self.files = [s["file"] for s in shards]
        segments = sorted((start, stop, i, off) for i, s in enumerate(shards)
                          for start, stop, off in s["rows"])  # fmt: skip
        self.starts = [s[0] for s in segments]
        self.segments = segments
        self._open: OrderedDict[int, Any] = OrderedDict()

    def handle(self, i: int) -> Any:
        f = self._open.pop(i, None)
        if f is None:
            try:
                f = safe_open(str(self.root / self.files[i]), framework="pt")
            except Exception as err:
                raise ExtractionError(
                    f"shard {self.files[i]} of {self.root} is unreadable ({err}); extract "
                    "again with overwrite=True",
                    code="corrupt",
                ) from None
            if len(self._open) >= _OPEN_LIMIT:
                self._open.popitem(last=False)
        self._open[i] = f
        return f

    def read(self, key: str, start: int, stop: int) -> Iterator[torch.Tensor]:
        """Rows ``start:stop`` of ``key``, as tensors from consecutive segments."""
        k = max(bisect.bisect_right(self.starts, start) - 1, 0)
        while start < stop and k < len(self.segments):
            seg_start, seg_stop, i, offset = self.segments[k]
            lo, hi = max(start, seg_start), min(stop, seg_stop)
            if lo < hi:
                yield self.handle(i).get_slice(key)[
                    offset + lo - seg_start : offset + hi - seg_start
                ]
                start = hi
            k += 1


class SiteArray:
    """One site's rows, one per example, read from disk only when indexed.

    It indexes like the whole ``(n_examples, ...)`` tensor: ``array[i]``, ``array[a:b, j]``,
    ``array[[i, k], :2]``, ``array[mask]`` give tensors, reading only the rows the first index
    names; ``array[:]``, ``array[...]`` or ``np.asarray(array)`` everything. ``shape[0]`` is
    the number of examples.

    Example:
        >>> import tempfile, torch, torchlens as tl
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
        >>> ex = tl.extract(model, [torch.ones(4, 4)], save=tl.func("relu"),
        ...                 to=tempfile.mkdtemp() + "/run", progress=False)
        >>> ex["relu_1"], ex["relu_1"][1:3].shape
        (SiteArray('relu_1', shape=(4, 3), dtype=torch.float32), torch.Size([2, 3]))
    """

    def __init__(self, shards: _Shards, key: str, shape: list[int], dtype: str) -> None:
        self._shards, self._key = shards, key
        self.shape = tuple(shape)
        self.dtype = _DTYPES.get(dtype, dtype)

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __getitem__(self, index: Any) -> torch.Tensor:
        """Index as the whole ``(n_examples, ...)`` tensor would be, reading only the rows
        that the first index names (all rows when it is ``...``, ``None`` or a bool)."""
        key = index if isinstance(index, tuple) else (index,)
        if not key:
            return self._rows(0, len(self))
        rows, rest = _scalar(key[0]), key[1:]
        if rows is None or rows is Ellipsis or isinstance(rows, bool):
            return self._rows(0, len(self))[key]
        if isinstance(rows, (int, np.integer)):
            i = int(rows) + (len(self) if rows < 0 else 0)
            if not 0 <= i < len(self):
                raise IndexError(f"row {rows} is out of range for {len(self)} examples")
            return self._rows(i, i + 1)[(0, *rest)]
        if isinstance(rows, slice):
            start, stop, step = rows.indices(len(self))
            if step == 1:
                return self._rows(start, stop)[(slice(None), *rest)]
            rows = np.arange(start, stop, step)
        rows = _index_array(rows)
        if rows.dtype == bool:  # a mask over the rows (and maybe the next dimensions)
            if rows.shape != self.shape[: rows.ndim]:
                raise IndexError(
                    f"a mask of shape {rows.shape} does not match the first dimensions of "
                    f"{self.shape}"
                )
            rows, *more = np.nonzero(rows)
            rest = (*(torch.from_numpy(m) for m in more), *rest)
        block, positions = self._gather(rows)
        return block[(positions, *rest)]

    def _rows(self, start: int, stop: int) -> torch.Tensor:
        parts = list(self._shards.read(self._key, start, stop))
        if not parts:
            return torch.empty((0, *self.shape[1:]), dtype=self.dtype)
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def _gather(self, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows named (any shape of indices) read as runs of nearby rows, not the whole
        span between them, and where each named row is in what was read."""
        rows = np.where(rows < 0, rows + len(self), rows)
        if rows.size and (rows.min() < 0 or rows.max() >= len(self)):
            raise IndexError(f"rows out of range for {len(self)} examples")
        wanted = np.unique(rows)
        if not wanted.size:
            empty = torch.empty((0, *self.shape[1:]), dtype=self.dtype)
            return empty, torch.from_numpy(rows.astype(np.int64))
        cuts = np.flatnonzero(np.diff(wanted) > _GAP) + 1
        runs = np.split(wanted, cuts)
        blocks = [self._rows(int(run[0]), int(run[-1]) + 1) for run in runs]
        firsts = np.array([run[0] for run in runs])
        offsets = np.cumsum([0] + [len(b) for b in blocks[:-1]])
        k = np.searchsorted(firsts, rows, side="right") - 1
        block = blocks[0] if len(blocks) == 1 else torch.cat(blocks)
        return block, torch.from_numpy((offsets[k] + rows - firsts[k]).astype(np.int64))

    def numpy(self) -> np.ndarray:
        """Every row as one numpy array (bfloat16 is widened to float32)."""
        t = self[:]
        return (t.float() if t.dtype == torch.bfloat16 else t).numpy()

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self.numpy()
        return out if dtype is None else out.astype(dtype)

    def __repr__(self) -> str:
        return f"SiteArray({self._key!r}, shape={self.shape}, dtype={self.dtype})"


def _scalar(index: Any) -> Any:
    """A 0-d integer (or bool) tensor or array as the Python number it holds."""
    if isinstance(index, torch.Tensor) and index.ndim == 0:
        if index.dtype == torch.bool:
            return bool(index)
        if not (index.dtype.is_floating_point or index.dtype.is_complex):
            return int(index)
    if isinstance(index, np.ndarray) and index.ndim == 0:
        if index.dtype == bool:
            return bool(index)
        if np.issubdtype(index.dtype, np.integer):
            return int(index)
    return index


def _index_array(index: Any) -> np.ndarray:
    """Row indices (integers of any shape, or a mask) as a numpy array."""
    if isinstance(index, torch.Tensor):
        index = index.cpu().numpy()
    array = np.asarray(index)
    if array.size == 0 and array.dtype != bool:
        return array.astype(np.int64)
    if array.dtype != bool and not np.issubdtype(array.dtype, np.integer):
        raise IndexError(
            f"only integers, slices, ..., None, integer or boolean arrays and tensors index "
            f"the rows; got {type(index).__name__} of {array.dtype}"
        )
    return array


class _SiteDataset(Dataset):
    def __init__(self, arrays: list[SiteArray]) -> None:
        self.arrays = arrays

    def __len__(self) -> int:
        return len(self.arrays[0])

    def __getitem__(self, i: int) -> Any:
        items = tuple(a[i] for a in self.arrays)
        return items[0] if len(items) == 1 else items

    def __getitems__(self, indices: list[int]) -> list[Any]:
        """A DataLoader's batch in one read per site instead of one per row."""
        blocks = [a[indices] for a in self.arrays]
        if len(blocks) == 1:
            return list(blocks[0])
        return [tuple(b[k] for b in blocks) for k in range(len(indices))]


class Extraction(Mapping):
    """A finished ``tl.extract`` run: ``{site label: SiteArray}`` plus metadata.

    Attributes:
        meta: the manifest (``n_examples``, ``model``, ``torch_version``,
            ``torchlens_version``, ``args`` and the shard index).
        targets: the stored ``targets=`` part of each batch, or ``None``.

    Example:
        >>> import tempfile, torch, torchlens as tl
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
        >>> batches = [(torch.randn(5, 4), torch.arange(5))]
        >>> ex = tl.extract(model, batches, save=tl.func("linear", "relu"), inputs=0, targets=1,
        ...                 to=tempfile.mkdtemp() + "/run", progress=False)
        >>> list(ex), ex.n_examples, ex.meta["sites"]["relu_1"]["shape"]
        (['linear_1', 'relu_1'], 5, [5, 3])
        >>> features, label = ex.dataset("relu_1")[4]
        >>> features.shape, int(label)
        (torch.Size([3]), 4)
    """

    def __init__(self, root: Path, manifest: dict[str, Any]) -> None:
        self.root, self.meta = root, manifest
        shards = _Shards(root, manifest["shards"])
        sites = manifest["sites"]  # "site_order": the order the model computed them
        order = [k for k in manifest.get("site_order", []) if k in sites]
        order += [k for k in sites if k not in order]
        self._sites = {k: SiteArray(shards, k, sites[k]["shape"], sites[k]["dtype"])
                       for k in order}  # fmt: skip
        t = manifest.get("targets")
        self.targets = SiteArray(shards, TARGETS, t["shape"], t["dtype"]) if t else None

    def __getitem__(self, site: str) -> SiteArray:
        if site not in self._sites:
            names = [k for k, op in self.meta.get("site_ops", {}).items() if op == site]
            hint = (
                f"; {site!r} is stored as {' and as '.join(map(repr, names))}: a module's "
                "output is named by the module's address"
                if names
                else ""
            )
            raise LookupFailedError(
                f"no site {site!r} in {self.root}{hint}; sites: {list(self._sites)}"
            )
        return self._sites[site]

    def __iter__(self) -> Iterator[str]:
        return iter(self._sites)

    def __len__(self) -> int:
        return len(self._sites)

    @property
    def n_examples(self) -> int:
        """Examples (rows) in every site."""
        return int(self.meta["n_examples"])

    def dataset(self, *sites: str, targets: bool = True) -> Dataset:
        """A ``Dataset`` of rows: ``ds[i]`` is ``(site rows..., target)`` (one tensor when
        only one is asked for), for training probes on the features.

        Args:
            sites: site labels; all sites when none is given.
            targets: add the stored target as the last item (when there is one).
        """
        arrays = [self[s] for s in (sites or tuple(self._sites))]
        if targets and self.targets is not None:
            arrays.append(self.targets)
        return _SiteDataset(arrays)

    def __repr__(self) -> str:
        return f"<Extraction: {self.n_examples} examples, sites {list(self._sites)}>"


def load_extraction(path: str | os.PathLike) -> Extraction:
    """Open a finished ``tl.extract`` run; arrays are read from disk only when indexed.

    Args:
        path: the ``to=`` directory of the run.

    Returns:
        An :class:`Extraction`: ``ex["relu_1"][:10]`` are the first ten rows of that site,
        ``ex.meta`` the manifest, ``ex.dataset()`` a ``torch.utils.data.Dataset`` view.

    Raises:
        ExtractionError: ``not_an_extraction`` (no run there), ``incomplete`` (the run did
            not finish: rerun ``tl.extract`` with the same arguments), ``corrupt``.

    Example:
        >>> import tempfile, torch, torchlens as tl
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
        >>> run = tempfile.mkdtemp() + "/run"
        >>> _ = tl.extract(model, [torch.randn(5, 4)], save=tl.func("relu"), to=run)
        >>> ex = tl.load_extraction(run)
        >>> ex["relu_1"].shape, ex.n_examples
        ((5, 3), 5)
    """
    root = Path(path)
    return Extraction(root, read_manifest(root))
