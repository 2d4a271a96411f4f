"""The one rule for user functions: the op (or the batch, for ``reduce=``) is passed only to
a function with two required positional parameters or a parameter named for it, the same in
``intervene=``, ``Trace.rerun``, ``edits.edit_pattern`` and ``tl.extract(reduce=)``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchlens as tl
from torchlens import edits
from torchlens._calls import with_second
from torchlens.errors import InvalidArgumentError


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)).eval()


def _loop_edits():
    """The loop-variable idiom: one edit per scale, each capturing its scale by default."""
    return [lambda t, s=s: t * s for s in (0.0, 2.0)]


def test_a_default_captured_loop_variable_keeps_its_default_in_intervene():
    model, x = _mlp(), torch.randn(2, 4)
    with torch.no_grad():
        hidden = model[1](model[0](x))
    for fn, scale in zip(_loop_edits(), (0.0, 2.0)):
        trace = tl.trace(model, x, intervene={tl.func("relu"): fn})
        torch.testing.assert_close(trace.output, model[2](hidden * scale))
        recording = tl.record(model, x, intervene={tl.func("relu"): fn})
        torch.testing.assert_close(recording.output, model[2](hidden * scale))


def test_a_default_captured_loop_variable_keeps_its_default_in_rerun():
    model, x = _mlp(), torch.randn(2, 4)
    trace = tl.trace(model, x)
    for fn, scale in zip(_loop_edits(), (0.0, 2.0)):
        edited = trace.rerun({tl.func("relu"): fn})
        torch.testing.assert_close(edited.output, model[2](trace["relu_1"].out * scale))


def test_a_flag_default_is_not_overwritten_by_the_op():
    """``negate=False`` would be truthy if it received the op: a silently wrong edit."""
    model, x = _mlp(), torch.randn(2, 4)

    def edit(t, negate=False):
        return -t if negate else t * 1.0

    trace = tl.trace(model, x, intervene={tl.func("relu"): edit})
    torch.testing.assert_close(trace.output, tl.trace(model, x).output)


def test_functions_asking_for_the_op_get_it():
    model, x = _mlp(), torch.randn(2, 4)
    seen: list[str] = []

    def by_name(t, op=None):
        seen.append(op.label)
        return t

    def keyword_only(t, *, op):
        seen.append(op.label)
        return t

    for fn in (lambda t, op: seen.append(op.label) or t, by_name, keyword_only):
        tl.trace(model, x, intervene={tl.func("relu"): fn})
    assert seen == ["relu_1"] * 3


def test_edit_pattern_with_a_captured_default():
    q, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4)
    fn = lambda q, v: F.scaled_dot_product_attention(q, q, v)  # noqa: E731
    sdpa = tl.func("scaled_dot_product_attention")
    eye = torch.eye(3)
    edit = edits.edit_pattern(lambda p, target=eye: target.expand_as(p))
    edited = tl.trace(fn, (q, v), intervene={sdpa: edit})
    torch.testing.assert_close(edited.output, v)


def test_extract_reduce_with_a_captured_default_does_not_get_the_batch(tmp_path):
    model = _mlp()
    data = [torch.randn(3, 4) for _ in range(2)]
    reduce = lambda t, k=2: t[:, :k]  # noqa: E731
    ex = tl.extract(model, data, save=tl.func("relu"), reduce=reduce, to=tmp_path / "r",
                    progress=False)  # fmt: skip
    with torch.no_grad():
        expected = torch.cat([model[1](model[0](b))[:, :2] for b in data])
    torch.testing.assert_close(torch.as_tensor(ex["relu_1"][:]), expected)

    def by_name(t, batch=None):  # asks for the batch by name
        return t * batch.sum(1, keepdim=True)

    ex = tl.extract(model, data, save=tl.func("relu"), reduce=by_name, to=tmp_path / "b",
                    progress=False)  # fmt: skip
    with torch.no_grad():
        expected = torch.cat([model[1](model[0](b)) * b.sum(1, keepdim=True) for b in data])
    torch.testing.assert_close(torch.as_tensor(ex["relu_1"][:]), expected)


def test_the_rule_itself():
    def two(a, b):
        return (a, b)

    def named(a, op=1):
        return (a, op)

    assert with_second(two, "op")(1, 2) == (1, 2)
    assert with_second(named, "op")(1, 2) == (1, 2)
    assert with_second(lambda a, b=5: (a, b), "op")(1, 2) == (1, 5)
    assert with_second(lambda a, *rest: (a, rest), "op")(1, 2) == (1, ())
    assert with_second(lambda a, batch=0: (a, batch), "batch")(1, 2) == (1, 2)
    assert with_second(lambda: 0, "op") is None
    assert with_second(lambda a, b, c: 0, "op") is None
    assert with_second(abs, "op")(-3, "ignored") == 3


def test_edit_pattern_refuses_a_function_of_neither_form():
    with pytest.raises(InvalidArgumentError) as info:
        edits.edit_pattern(lambda p, op, extra: p)
    assert info.value.code == "bad_edit"
