"""The one-liner of ``docs/interpretability.md`` that selects each block's output (the
residual stream) of a transformers LM, checked against forward hooks on the blocks."""

from __future__ import annotations

import pytest
import torch

import torchlens as tl
from tests import _tiny_llms as tiny


@pytest.mark.parametrize(
    ("name", "block", "layers"),
    [("gpt2", "GPT2Block", "transformer.h"), ("llama", "LlamaDecoderLayer", "model.layers")],
)
def test_one_selector_keeps_every_blocks_output(name, block, layers):
    model = getattr(tiny, name)()
    ids = tiny.ids(5)
    seen = []
    handles = [
        layer.register_forward_hook(
            lambda m, a, out: seen.append(out[0] if isinstance(out, tuple) else out)
        )
        for layer in model.get_submodule(layers)
    ]
    try:
        with torch.no_grad():
            model(ids)
    finally:
        for handle in handles:
            handle.remove()
    trace = tl.trace(model, ids, save=tl.module(type=block).output)
    stream = [op for op in trace if op.has_out]
    assert [op.module for op in stream] == [f"{layers}.0", f"{layers}.1"]
    for op, expected in zip(stream, seen, strict=True):
        torch.testing.assert_close(op.out, expected, rtol=0, atol=0)
