"""Assertions that two traces hold the same records and bit-identical values (io tests)."""

from __future__ import annotations

import dataclasses

import torch

from torchlens.capture.tree import flatten
from torchlens.io._encode import encode
from torchlens.trace import ModuleCall, Op, Source, Trace

__all__ = ["assert_same_trace", "assert_bits_equal"]

_IO_NOTES = {"replay_unavailable", "output_unavailable"}


def assert_bits_equal(a: torch.Tensor, b: torch.Tensor, what: str = "") -> None:
    """Same dtype, shape and bytes (NaNs included)."""
    assert a.dtype == b.dtype, f"{what}: dtype {a.dtype} != {b.dtype}"
    assert a.shape == b.shape, f"{what}: shape {a.shape} != {b.shape}"
    assert torch.equal(_bits(a), _bits(b)), f"{what}: values differ"


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().resolve_conj().resolve_neg().cpu()
    if t.is_complex():
        t = torch.view_as_real(t)
    return t.clone(memory_format=torch.contiguous_format).reshape(-1).view(torch.uint8)


def assert_same_trace(loaded: Trace, original: Trace, payloads: bool = True) -> None:
    """``loaded`` describes the same capture as ``original``, field by field."""
    assert loaded.labels == original.labels
    assert loaded.input_labels == original.input_labels
    assert loaded.output_labels == original.output_labels
    assert {k: v for k, v in loaded.meta.items() if k not in _IO_NOTES} == original.meta
    _same_rng(loaded.rng_state, original.rng_state, "trace")
    for a, b in zip(loaded.modules, original.modules, strict=True):
        for f in dataclasses.fields(ModuleCall):
            assert getattr(a, f.name) == getattr(b, f.name), (a.name, f.name)
    for a, b in zip(loaded.sources, original.sources, strict=True):
        _same_fields(a, b, Source)
    for a, b in zip(loaded.ops, original.ops, strict=True):
        _same_op(a, b)
    if payloads:
        for record in [*original.sources, *original.ops]:
            _same_payload(loaded[record.label], record)
        _same_output(loaded, original)


def _same_fields(a, b, cls, skip=()) -> None:
    for f in dataclasses.fields(cls):
        if f.name.startswith("_") or f.name in skip:
            continue
        assert getattr(a, f.name) == getattr(b, f.name), (a.label, f.name)


def _same_op(a: Op, b: Op) -> None:
    _same_fields(a, b, Op, skip=("func", "args_template", "kwargs_template", "rng_state", "meta"))
    assert {k: v for k, v in a.meta.items() if k not in _IO_NOTES} == b.meta, a.label
    _same_rng(a.rng_state, b.rng_state, a.label)
    if a.func is None:  # only when the original had none or io says why
        assert b.func is None or a.meta.get("replay_unavailable"), a.label
        return
    assert a.func is b.func or a.func == b.func, a.label
    # compared in file form, where NaN equals NaN and tuple differs from list
    assert encode(a.args_template) == encode(b.args_template), a.label
    assert encode(a.kwargs_template) == encode(b.kwargs_template), a.label


def _same_rng(a, b, what: str) -> None:
    assert (a is None) == (b is None), what
    if a is not None:
        assert sorted(a) == sorted(b), what
        for key in a:
            assert_bits_equal(a[key], b[key], f"{what} rng {key}")


def _same_payload(loaded, original) -> None:
    assert loaded.has_out == original.has_out, loaded.label
    if original.has_out:
        assert_bits_equal(loaded.out, original.out, loaded.label)


def _same_output(loaded: Trace, original: Trace) -> None:
    if loaded.output is None and "output_unavailable" in loaded.meta:
        return
    a, b = flatten(loaded.output), flatten(original.output)
    assert len(a[0]) == len(b[0])
    for (pa, ta), (pb, tb) in zip(a[0], b[0], strict=True):
        assert pa == pb
        assert_bits_equal(ta, tb, f"output {pa}")
