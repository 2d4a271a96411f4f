"""The one-capture-path property: ``tl.record`` and ``tl.extract`` name, number and place
every op as ``tl.trace`` does (issue 49). Shared by the test models, the tiny transformers
and the real-model zoo (``tests/realworld``)."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from typing import Any

import torch

import torchlens as tl
from torchlens.errors import SelectorMatchError

__all__ = ["EVERY_OP", "op_keys", "assert_record_agrees", "assert_extract_agrees"]

EVERY_OP = tl.where(lambda op: True)


def op_keys(ops: Any) -> list[tuple]:
    """``(label, index, func_name, output_index, module_stack)`` of each op, in order."""
    return [
        (op.label, op.index, op.func_name, op.output_index, tuple(op.module_stack)) for op in ops
    ]


def _call(build: Callable[[], tuple[Any, tuple, dict]], fn: Callable, **options: Any) -> Any:
    model, args, kwargs = build()
    torch.manual_seed(0)
    return fn(model, args, kwargs, **options)


def assert_record_agrees(build: Callable[[], tuple[Any, tuple, dict]]) -> None:
    """``tl.record(save=<every op>)`` keeps every op of ``tl.trace`` under the same label,
    index, function, output index and module calls; ``build`` makes a fresh
    ``(model, args, kwargs)`` for each run."""
    with torch.no_grad():  # a first call fills the model's caches (BEiT's lru_cache)
        _call(build, lambda model, args, kwargs: model(*args, **kwargs))
    trace = _call(build, tl.trace)
    if not len(trace):
        try:
            _call(build, tl.record, save=EVERY_OP)
        except SelectorMatchError:
            return
        raise AssertionError("tl.record kept ops of a forward tl.trace records none of")
    rec = _call(build, tl.record, save=EVERY_OP)
    got, want = op_keys(rec), op_keys(trace)
    first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    assert got == want, (
        f"record and trace part at op {first} of {len(want)} (record has {len(got)}): "
        f"record {got[first : first + 2]}, trace {want[first : first + 2]}"
    )


def assert_extract_agrees(model: Any, x: torch.Tensor) -> None:
    """``tl.extract`` over one batch ``x`` stores, for a selection by index (the ops whose
    first dimension is the batch), the sites ``tl.trace`` labels with those indices."""
    torch.manual_seed(0)
    trace = tl.trace(model, x)
    chosen = {
        op.index: op.label
        for op in trace
        if op.shape and op.shape[0] == x.shape[0] and op.dtype.is_floating_point
    }
    if not chosen:
        return
    with tempfile.TemporaryDirectory() as folder:
        torch.manual_seed(0)
        ex = tl.extract(
            model, [x], save=tl.where(lambda op: op.index in chosen), to=folder + "/run",
            progress=False,
        )  # fmt: skip
        assert sorted(ex) == sorted(chosen.values())
