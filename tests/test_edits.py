"""Edit helpers (``torchlens.edits``): their math, their errors, and validation with them."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchlens as tl
from tests.models import ZOO_BY_NAME
from torchlens import edits
from torchlens.errors import InterventionError


class _Op:
    label, shape = "x_1", (2, 3)


T = torch.arange(6.0).reshape(2, 3)


def test_the_math_of_each_helper():
    op = _Op()
    assert edits.zero()(T, op).tolist() == [[0, 0, 0], [0, 0, 0]]
    assert edits.mean()(T, op).tolist() == [[1.5, 2.5, 3.5]] * 2  # over the batch
    assert edits.mean(dim=1)(T, op).tolist() == [[1, 1, 1], [4, 4, 4]]
    assert edits.mean(value=torch.tensor([9.0, 8, 7]))(T, op).tolist() == [[9, 8, 7]] * 2
    assert edits.scale(-2)(T, op).tolist() == [[0, -2, -4], [-6, -8, -10]]
    assert edits.clamp(1, 4)(T, op).tolist() == [[1, 1, 2], [3, 4, 4]]
    assert edits.add(torch.tensor([1.0, 0, 0]), alpha=10)(T, op).tolist() == [
        [10, 1, 2], [13, 4, 5],
    ]  # fmt: skip
    assert edits.add(torch.tensor([1.0, 2]), dim=0)(T, op).tolist() == [[1, 2, 3], [5, 6, 7]]
    assert edits.replace(torch.tensor(7.0))(T, op).tolist() == [[7, 7, 7]] * 2
    e0 = torch.tensor([1.0, 0, 0])
    assert edits.project(e0)(T, op).tolist() == [[0, 1, 2], [0, 4, 5]]
    assert edits.project(e0, keep=True)(T, op).tolist() == [[0, 0, 0], [3, 0, 0]]
    plane = torch.tensor([[1.0, 1, 0], [1.0, -1, 0]])  # spans the first two axes
    torch.testing.assert_close(edits.project(plane)(T, op), torch.tensor([[0, 0, 2.0], [0, 0, 5]]))


def test_project_uses_the_span_of_dependent_or_zero_directions():
    op, t = _Op(), torch.tensor([[3.0, 4.0, 5.0]])
    e0, e1 = torch.tensor([1.0, 0, 0]), torch.tensor([0.0, 1, 0])
    for directions in (torch.stack([e0, e0]), torch.stack([e0, 2 * e0]), torch.stack([e0, 0 * e0])):
        torch.testing.assert_close(edits.project(directions)(t, op), torch.tensor([[0.0, 4, 5]]))
        torch.testing.assert_close(
            edits.project(directions, keep=True)(t, op), torch.tensor([[3.0, 0, 0]])
        )
    three = torch.stack([e0, e1, e0 + e1])  # rank 2 in 3 rows
    torch.testing.assert_close(edits.project(three)(t, op), torch.tensor([[0.0, 0, 5]]))
    assert edits.project(torch.zeros(3))(t, op).tolist() == [[3, 4, 5]]  # spans nothing
    assert edits.project(torch.zeros(2, 3), keep=True)(t, op).tolist() == [[0, 0, 0]]
    with pytest.raises(InterventionError) as info:
        edits.project(torch.tensor([float("nan"), 0, 0]))(t, op)
    assert info.value.code == "bad_edit"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_project_keeps_low_precision_dtypes(dtype):
    t = torch.tensor([[3.0, 4.0, 5.0]], dtype=dtype)
    out = edits.project(torch.tensor([1.0, 1, 0]))(t, _Op())
    assert out.dtype == dtype
    assert out.float().tolist() == [[-0.5, 0.5, 5.0]]
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)).to(dtype)
    x = torch.randn(3, 4, dtype=dtype)
    edit = {tl.module("0").output: edits.project(torch.randn(4))}
    edited = tl.trace(model, x, intervene=edit)
    assert edited.output.dtype == dtype
    torch.testing.assert_close(tl.trace(model, x).rerun(edit).output, edited.output)


def test_heads_edit_only_the_picked_heads():
    t = torch.ones(2, 4, 3, 5)  # batch, heads, tokens, head dim
    out = edits.zero(heads=[1, 3])(t, _Op())
    assert out[:, [0, 2]].eq(1).all() and out[:, [1, 3]].eq(0).all()
    out = edits.scale(3.0, heads=[0], head_dim=-1)(t, _Op())
    assert out[..., 0].eq(3).all() and out[..., 1:].eq(1).all()
    out = edits.zero(heads=[-1])(t, _Op())  # counted from the end, as dims are
    assert out[:, 3].eq(0).all() and out[:, :3].eq(1).all()
    assert t.eq(1).all()  # the input is never written


@pytest.mark.parametrize(
    "fn, phrase",
    [
        (edits.zero(heads=[4]), "heads=[4]"),
        (edits.zero(heads=[-5]), "heads=[-5]"),
        (edits.zero(heads=[0], head_dim=5), "head_dim=5"),
        (edits.add(torch.ones(4)), "length 3"),
        (edits.project(torch.ones(2)), "length 3"),
        (edits.mean(value=torch.ones(4)), "does not broadcast"),
        (edits.mean(dim=2), "dim=2"),
    ],
)
def test_wrong_shapes_and_axes_are_typed_errors(fn, phrase):
    with pytest.raises(InterventionError) as info:
        fn(T, _Op())
    assert info.value.code == "bad_edit"
    assert "'x_1'" in str(info.value) and "(2, 3)" in str(info.value) and phrase in str(info.value)


def test_resample_takes_the_other_runs_value():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    clean, corrupt = torch.randn(2, 4), torch.randn(2, 4)
    source = tl.trace(model, clean)
    patched = tl.trace(model, corrupt, intervene={tl.label("relu_1"): edits.resample(source)})
    torch.testing.assert_close(patched.output, source.output)
    wrong = tl.trace(model, torch.randn(5, 4))
    with pytest.raises(InterventionError) as info:
        tl.trace(model, corrupt, intervene={tl.label("relu_1"): edits.resample(wrong)})
    assert info.value.code == "not_comparable" and "(5, 3)" in str(info.value)


def test_ablating_one_attention_head_changes_the_output():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True).eval()
    x = torch.randn(2, 5, 16)
    sdpa = tl.func("scaled_dot_product_attention")
    plain = tl.trace(layer, x)
    one = tl.trace(layer, x, intervene={sdpa: edits.zero(heads=[2])})
    assert not torch.allclose(one.output, plain.output)
    head_out = one["scaled_dot_product_attention_1"].out
    assert head_out[:, 2].eq(0).all() and head_out[:, [0, 1, 3]].ne(0).any()
    assert tl.validate(layer, x, intervene={sdpa: edits.zero(heads=[2])})


FITS = {  # zoo model -> an op every helper can edit (float, at least 2-d, last axis > 1)
    "mlp_tiny": tl.func("relu"),
    "conv2d_net": tl.func("conv2d"),
    "residual_blocks": tl.func("relu"),
    "transformer_encoder_layer": tl.func("scaled_dot_product_attention"),
    "multihead_attention": tl.func("softmax"),
}


def _helpers(op):
    feature = torch.linspace(-1, 1, op.shape[-1])
    return {
        "zero": edits.zero(),
        "mean": edits.mean(),
        "scale": edits.scale(0.5),
        "clamp": edits.clamp(-0.1, 0.1),
        "add": edits.add(feature, alpha=0.3),
        "project": edits.project(feature),
        "project_keep": edits.project(feature, keep=True),
        "replace": edits.replace(torch.tensor(0.25)),
        "heads": edits.zero(heads=[0], head_dim=1),
    }


@pytest.mark.parametrize("name", sorted(FITS))
def test_validate_passes_with_every_helper(name):
    case = ZOO_BY_NAME[name]
    model, (args, kwargs) = case.make_model(), case.make_inputs()
    op = next(op for op in tl.trace(model, args, kwargs) if FITS[name].matches(op))
    sel = tl.label(op.label)  # one op: the helpers are built for its shape
    helpers = _helpers(op)
    other = tuple(a * 0.5 + 0.1 if a.dtype.is_floating_point else a for a in args)
    helpers["resample"] = edits.resample(tl.trace(case.make_model(), other, kwargs))
    for helper_name, fn in helpers.items():
        model, (args, kwargs) = case.make_model(), case.make_inputs()
        assert tl.validate(model, args, kwargs, intervene={sel: fn}, random_seed=0), helper_name
