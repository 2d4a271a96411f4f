"""Module outputs as selectors: ``tl.module(...).output`` and ``tl.module(type=...)``."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.errors import InvalidArgumentError, MixedShapesWarning


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.ln = nn.LayerNorm(8)

    def forward(self, x):
        return self.ln(x + torch.relu(self.fc(x)))


class Recurrent(nn.Module):
    """One block called twice: two calls of the same module."""

    def __init__(self) -> None:
        super().__init__()
        self.block = Block()
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.block(self.block(x)))


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(Block(), Block(), nn.Linear(8, 3)).eval()


X = torch.randn(2, 8, generator=torch.Generator().manual_seed(2))


def _zero(t, op):
    return t * 0


def test_output_matches_only_what_the_call_returned():
    trace = tl.trace(_model(), X)
    sel = tl.module("0").output
    assert [op.label for op in trace if sel.matches(op)] == ["layer_norm_1"]
    assert [op.label for op in trace if tl.module("0").matches(op)] == [
        "linear_1", "relu_1", "add_1", "layer_norm_1",
    ]  # fmt: skip
    assert ("0", 1, "Block") in trace["layer_norm_1"].returned_by
    assert repr(sel) == "module('0').output"


def test_output_works_for_save_record_and_stop_after():
    model = _model()
    saved = tl.trace(model, X, save=tl.module("1").output)
    assert [op.label for op in saved if op.has_out] == ["layer_norm_2"]
    recording = tl.record(model, X, save=tl.module("1").output)
    assert [view.label for view in recording] == ["layer_norm_2"]
    torch.testing.assert_close(recording["layer_norm_2"].out, saved["layer_norm_2"].out)
    halted = tl.trace(model, X, stop_after=tl.module("0").output)
    assert halted.halted and halted.labels[-1] == "layer_norm_1"
    assert halted.meta["halted_at"] == "layer_norm_1"


def test_intervening_on_an_output_edits_it_once():
    model = _model()
    edited = tl.trace(model, X, intervene={tl.module("1").output: _zero})
    assert edited.meta["intervened"] == ["layer_norm_2"]
    # the head reads zeros: its output is its bias
    torch.testing.assert_close(edited.output, model[2].bias.expand(2, 3))
    recorded = tl.record(model, X, intervene={tl.module("1").output: _zero})
    torch.testing.assert_close(recorded.output, edited.output)
    assert tl.validate(model, X, intervene={tl.module("1").output: _zero})


def test_call_picks_one_call_of_a_module_run_twice():
    torch.manual_seed(0)
    model = Recurrent().eval()
    trace = tl.trace(model, X)
    second = tl.module("block", call=2).output
    assert [op.label for op in trace if second.matches(op)] == ["layer_norm_2"]
    edited = tl.trace(model, X, intervene={second: _zero})
    torch.testing.assert_close(edited.output, model.head.bias.expand(2, 3))
    first = tl.trace(model, X, intervene={tl.module("block", call=1).output: _zero})
    assert first.meta["intervened"] == ["layer_norm_1"]
    assert not torch.allclose(first.output, edited.output)


def test_select_by_module_type():
    model = _model()
    trace = tl.trace(model, X)
    linear_out = tl.module(type=nn.Linear).output
    assert [op.label for op in trace if linear_out.matches(op)] == [
        "linear_1", "linear_2", "linear_3",
    ]  # fmt: skip
    blocks = tl.module(type="Block").output
    assert [op.label for op in trace if blocks.matches(op)] == ["layer_norm_1", "layer_norm_2"]
    norms = tl.module(type=nn.LayerNorm)
    assert [op.label for op in trace if norms.matches(op)] == ["layer_norm_1", "layer_norm_2"]
    recording = tl.record(model, X, save=tl.module(type=nn.Linear))
    assert [view.label for view in recording] == ["linear_1", "linear_2", "linear_3"]


def test_output_of_an_opened_attention_group():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True).eval()
    x = torch.randn(2, 5, 16)
    sel = tl.module("self_attn").output
    trace = tl.trace(layer, x, save=sel)
    kept = [op for op in trace if op.has_out]
    assert [op.func_name for op in kept] == ["transpose"] and kept[0].shape == (2, 5, 16)
    assert tl.validate(layer, x, intervene={sel: _zero})


def test_a_selector_editing_several_shapes_warns():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True).eval()
    x = torch.randn(2, 5, 16)
    with pytest.warns(MixedShapesWarning, match=r"tl.module\(\.\.\.\).output"):
        tl.trace(layer, x, intervene={tl.module("self_attn"): lambda t, op: t})
    with pytest.warns(MixedShapesWarning):
        tl.record(layer, x, intervene={tl.module("self_attn"): lambda t, op: t})
    with warnings.catch_warnings():
        warnings.simplefilter("error", MixedShapesWarning)
        tl.trace(layer, x, intervene={tl.module("self_attn").output: lambda t, op: t})
        tl.trace(_model(), X, intervene={tl.module("0"): lambda t, op: t})  # one shape


def test_bad_module_selectors_are_refused():
    for bad in (lambda: tl.module(), lambda: tl.module(3), lambda: tl.module(type=3)):
        with pytest.raises(InvalidArgumentError) as info:
            bad()
        assert info.value.code == "bad_selector"


def test_output_selectors_work_on_a_loaded_trace(tmp_path):
    trace = tl.trace(_model(), X)
    loaded = tl.load(trace.save(tmp_path / "t"))
    sel = tl.module(type="Block").output
    assert [op.label for op in loaded if sel.matches(op)] == ["layer_norm_1", "layer_norm_2"]
    assert "layer_norm_2" in loaded.summary(tl.module("1").output)
