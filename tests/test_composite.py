"""Opened composite functions: ``F.multi_head_attention_forward`` recorded as a group of ops."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchlens as tl
from torchlens.capture.composite import close_function, open_function
from torchlens.errors import InvalidArgumentError

GROUP = "multi_head_attention_forward"


def _encoder() -> nn.Module:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()


def _x() -> torch.Tensor:
    return torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(1))


def test_mha_is_a_group_of_its_inner_ops():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 4, batch_first=True)
    x = _x()
    trace = tl.trace(mha, (x, x, x))
    names = [op.func_name for op in trace]
    assert GROUP not in names
    for inner in ("linear", "getitem", "bmm", "softmax", "mean"):
        assert inner in names
    group = trace.modules[GROUP]
    assert group.module_type == GROUP
    assert group.outputs == ("view_4", "mean_1")  # attn_output and the averaged weights
    assert trace["softmax_1"].shape == (8, 5, 5)  # batch * heads, queries, keys
    assert trace["softmax_1"].module_stack == ((GROUP, 1),)
    expected_out, expected_weights = mha(x, x, x)
    torch.testing.assert_close(trace.output[0], expected_out)
    torch.testing.assert_close(trace["mean_1"].out, expected_weights)
    assert tl.validate(mha, (x, x, x))


def test_encoder_under_no_grad_eval_is_traced_op_by_op():
    model, x = _encoder(), _x()
    with torch.no_grad():
        trace = tl.trace(model, x)
        expected = model(x)
    torch.testing.assert_close(trace.output, expected)
    sdpa = trace.ops[[op.func_name for op in trace].index("scaled_dot_product_attention")]
    assert sdpa.module_stack[-1] == (f"layers.0.self_attn.{GROUP}", 1)
    q, k, v = (trace[label] for label in sdpa.parents[:3])
    assert q.shape == k.shape == v.shape == (2, 4, 5, 4)  # batch, heads, tokens, head dim
    # the recorded q and k give the attention pattern the kernel used
    pattern = (q.out @ k.out.transpose(-2, -1) / 2.0).softmax(-1)
    torch.testing.assert_close(pattern @ v.out, sdpa.out)
    with torch.no_grad():
        assert tl.validate(model, x)


def test_closing_the_function_hides_qkv_again():
    model, x = _encoder(), _x()
    close_function(F.multi_head_attention_forward)
    try:
        closed = tl.trace(model, x)
    finally:
        open_function(F.multi_head_attention_forward)
    opened = tl.trace(model, x)
    assert GROUP in [op.func_name for op in closed]
    assert "scaled_dot_product_attention" not in [op.func_name for op in closed]
    assert "scaled_dot_product_attention" in [op.func_name for op in opened]
    assert len(opened) > len(closed) + 20
    torch.testing.assert_close(opened.output, closed.output)


def test_record_counts_labels_as_trace_does():
    model, x = _encoder(), _x()
    select = tl.func("scaled_dot_product_attention") | tl.label("getitem_5")
    trace = tl.trace(model, x, save=select)
    recording = tl.record(model, x, save=select)
    kept = {view.label: view for view in recording}
    assert set(kept) == {op.label for op in trace if op.has_out}
    for label, view in kept.items():
        assert view.module_stack == trace[label].module_stack
        torch.testing.assert_close(view.out, trace[label].out)


def test_a_head_can_be_ablated_inside_the_group():
    model, x = _encoder(), _x()
    selector = tl.func("scaled_dot_product_attention") & tl.module("layers.1.self_attn.*")

    def zero_head_2(t, op):
        t = t.clone()
        t[:, 2] = 0
        return t

    edited = tl.trace(model, x, intervene={selector: zero_head_2})
    plain = tl.trace(model, x)
    assert edited.meta["intervened"] == ["scaled_dot_product_attention_2"]
    assert not torch.allclose(edited.output, plain.output)
    assert tl.validate(model, x, intervene={selector: zero_head_2})


def test_training_dropout_inside_the_group_validates():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 4, dropout=0.5, batch_first=True).train()
    x = _x()
    trace = tl.trace(mha, (x, x, x))
    assert "dropout" in [op.func_name for op in trace]
    assert tl.validate(mha, (x, x, x), random_seed=3)


def test_group_survives_save_load_draw_and_grads(tmp_path):
    model, x = _encoder(), _x()
    trace = tl.trace(model, x, save_grads=True)
    trace.backward()
    assert trace["getitem_1"].grad.shape == (5, 2, 16)
    loaded = tl.load(trace.save(tmp_path / "t"))
    assert loaded.modules[f"layers.0.self_attn.{GROUP}"].outputs == (
        trace.modules[f"layers.0.self_attn.{GROUP}"].outputs
    )
    torch.testing.assert_close(loaded["getitem_1"].out, trace["getitem_1"].out)
    dot = trace.to_dot()
    assert f'subgraph "cluster_layers.0.self_attn.{GROUP}:1"' in dot


def test_only_python_functions_open():
    with pytest.raises(InvalidArgumentError) as info:
        open_function(F.linear)
    assert info.value.code == "not_composite"
