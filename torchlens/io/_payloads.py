"""Payload tensors on disk: how one is stored, and the lazy store that reads them back.

Each stored tensor is a contiguous CPU copy in a safetensors file. Complex tensors are stored
as their real view (safetensors has no complex dtype) and marked ``"complex": true``.
Quantized tensors (``quint8``, ``qint8``, ``qint32``; per-tensor or per-channel) are stored as
their integer representation, their quantization parameters in the entry's ``"quantized"``
object, and rebuilt on reading. Each entry carries the SHA-256 of its stored bytes, checked
when the value is first read, so a corrupted file is reported rather than served.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from torchlens._tensors import inner_of
from torchlens._views import dtype_text as dtype_name  # "float32", as parse_dtype reads it
from torchlens.errors import PayloadUnavailableError, TraceFileError

__all__ = ["stored_form", "entry_for", "FilePayloadStore", "dtype_name", "parse_dtype"]

_OPEN_FILES = 8  # safetensors handles kept open at once
# quantized dtypes stored as their integer representation (quint4x2 and quint2x4 pack
# two or four values in a byte, which torch cannot rebuild a tensor from)
_QUANTIZED = {torch.quint8: torch.uint8, torch.qint8: torch.int8, torch.qint32: torch.int32}
_PER_TENSOR = (torch.per_tensor_affine,)
_PER_CHANNEL = (torch.per_channel_affine, torch.per_channel_affine_float_qparams)


def parse_dtype(name: Any) -> torch.dtype:
    """The dtype :func:`dtype_name` wrote; raises ``ValueError`` for anything else."""
    value = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(value, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return value


def stored_form(value: torch.Tensor) -> torch.Tensor:
    """The contiguous CPU tensor that is written for ``value`` (complex as a real view,
    quantized as its integer representation).

    Raises:
        ValueError: naming the kind of tensor that has no stored form (nested, sparse,
            quantized with a packed dtype).
    """
    tensor = value.detach()
    inner = inner_of(tensor)
    if inner is not None:  # a wrapper subclass (a DTensor): what it holds (its local shard)
        tensor = inner.detach()
    kind = _unstorable(tensor)
    if kind is not None:
        raise ValueError(f"{kind} tensors cannot be stored in safetensors")
    if tensor.is_quantized:
        tensor = tensor.int_repr()
    tensor = tensor.resolve_conj().resolve_neg()
    if tensor.is_complex():
        tensor = torch.view_as_real(tensor)
    tensor = tensor.to("cpu").contiguous()
    if tensor.dim() and tensor.stride(-1) != 1:  # a contiguous tensor of 0 or 1 element
        # may keep any stride (a column of an empty box tensor), which no byte view takes
        tensor = tensor.clone(memory_format=torch.contiguous_format)
    return tensor


def _unstorable(tensor: torch.Tensor) -> str | None:
    """What kind of tensor ``tensor`` is, if it has no stored form."""
    if tensor.is_nested:
        return "nested"
    if tensor.layout is not torch.strided:
        return f"{tensor.layout} (sparse or blocked)"
    if tensor.is_quantized:
        if tensor.dtype not in _QUANTIZED:
            return f"{tensor.dtype} quantized"
        if tensor.qscheme() not in _PER_TENSOR + _PER_CHANNEL:
            return f"{tensor.qscheme()} quantized"
    return None


def entry_for(value: torch.Tensor, stored: torch.Tensor, file: str, key: str) -> dict:
    """The manifest entry describing ``stored`` (made by :func:`stored_form`) in ``file``."""
    entry = {
        "complex": value.is_complex(),
        "dtype": dtype_name(value.dtype),
        "file": file,
        "key": key,
        "sha256": _digest(stored),
        "shape": list(value.shape),
    }
    inner = inner_of(value)
    if inner is not None:  # stored as the tensor it holds (a DTensor's local shard)
        entry["shape"] = list(inner.shape)
    if value.is_quantized:
        entry["quantized"] = _qparams(value)
    return entry


def _qparams(value: torch.Tensor) -> dict:
    """The quantization parameters of ``value`` in JSON (floats round-trip exactly)."""
    qscheme = value.qscheme()
    if qscheme in _PER_TENSOR:
        params = {"scale": value.q_scale(), "zero_point": value.q_zero_point()}
    else:
        scales, zero_points = value.q_per_channel_scales(), value.q_per_channel_zero_points()
        params = {
            "axis": value.q_per_channel_axis(),
            "scales": scales.tolist(),
            "scales_dtype": dtype_name(scales.dtype),
            "zero_points": zero_points.tolist(),
            "zero_points_dtype": dtype_name(zero_points.dtype),
        }
    return {"qscheme": str(qscheme).removeprefix("torch."), **params}


def _quantized(stored: torch.Tensor, params: Any) -> torch.Tensor:
    """The quantized tensor whose integer representation is ``stored``.

    Raises:
        ValueError, TypeError, KeyError, RuntimeError: for parameters :func:`_qparams`
            cannot have written.
    """
    qscheme = getattr(torch, params["qscheme"], None)
    if qscheme in _PER_TENSOR:
        scale, zero_point = params["scale"], params["zero_point"]
        if type(scale) not in (int, float) or type(zero_point) is not int:
            raise TypeError("a per-tensor scale is a number and its zero point an integer")
        return torch._make_per_tensor_quantized_tensor(stored, scale, zero_point)
    if qscheme not in _PER_CHANNEL:
        raise ValueError(f"unknown qscheme {params['qscheme']!r}")
    scales = torch.tensor(params["scales"], dtype=parse_dtype(params["scales_dtype"]))
    zero_points = torch.tensor(
        params["zero_points"], dtype=parse_dtype(params["zero_points_dtype"])
    )
    axis = params["axis"]
    if type(axis) is not int:
        raise TypeError("the axis is an integer")
    return torch._make_per_channel_quantized_tensor(stored, scales, zero_points, axis)


def _digest(stored: torch.Tensor) -> str:
    raw = stored.reshape(-1).view(torch.uint8).numpy()
    return hashlib.sha256(memoryview(raw)).hexdigest()


class FilePayloadStore:
    """Payloads of a saved trace, read lazily from its safetensors files.

    Implements the :class:`~torchlens.trace.PayloadStore` protocol. A value is read on first
    access and kept; it is a copy-on-write memory map of the file, so reading costs no copy
    and editing it never touches the file. If the caller edits it in place, the next access
    reads the original again.

    Args:
        root: the trace directory; every file name in ``entries`` is relative to it.
        entries: label -> manifest entry (see :func:`entry_for`).
        missing: label -> (code, message) for values that were not saved.
        default_missing: the reason for labels in neither mapping.
    """

    def __init__(
        self,
        root: Path,
        entries: dict[str, dict],
        missing: dict[str, tuple[str, str]] | None = None,
        default_missing: tuple[str, str] | None = None,
    ) -> None:
        self.root = root
        self.entries = entries
        self.missing = dict(missing or {})
        self.default_missing = default_missing or ("not_saved", "no value was saved")
        self._cache: dict[str, tuple[torch.Tensor, int]] = {}
        self._files: OrderedDict[str, Any] = OrderedDict()

    def get(self, label: str) -> torch.Tensor:
        cached = self._cache.get(label)
        if cached is not None and cached[0]._version == cached[1]:
            return cached[0]
        entry = self.entries.get(label)
        if entry is None:
            code, message = self.missing.get(label, self.default_missing)
            raise PayloadUnavailableError(message, code=code)
        if cached is not None:  # edited in place through its copy-on-write file mapping:
            self._files.pop(entry["file"], None)  # map the file afresh to read the original
        value = self._read(label, entry)
        self._cache[label] = (value, value._version)
        return value

    def has(self, label: str) -> bool:
        return label in self.entries

    def mark_missing(self, label: str, code: str, message: str) -> None:
        self.entries.pop(label, None)
        self.missing[label] = (code, message)

    def _read(self, label: str, entry: dict) -> torch.Tensor:
        try:
            stored = self._handle(entry["file"]).get_tensor(entry["key"])
        except (SafetensorError, OSError, KeyError) as err:
            raise _corrupt(entry["file"], f"cannot read {label!r}: {err}") from None
        if _digest(stored) != entry["sha256"]:
            raise _corrupt(entry["file"], f"the bytes of {label!r} do not match the manifest")
        value = torch.view_as_complex(stored) if entry["complex"] else stored
        if "quantized" in entry:
            try:
                value = _quantized(stored, entry["quantized"])
            except (ValueError, TypeError, KeyError, RuntimeError) as err:
                raise _corrupt(
                    entry["file"], f"the quantization parameters of {label!r} are bad: {err}"
                ) from None
        if dtype_name(value.dtype) != entry["dtype"] or list(value.shape) != entry["shape"]:
            raise _corrupt(entry["file"], f"{label!r} has the wrong dtype or shape")
        return value

    def _handle(self, file: str) -> Any:
        handle = self._files.pop(file, None)
        if handle is None:
            handle = safe_open(str(self.root / file), framework="pt", device="cpu")
        self._files[file] = handle
        while len(self._files) > _OPEN_FILES:
            self._files.popitem(last=False)
        return handle


def _corrupt(file: str, detail: str) -> TraceFileError:
    return TraceFileError(
        f"payload file {file!r} is damaged ({detail}); save the trace again",
        code="corrupt_payload",
    )
