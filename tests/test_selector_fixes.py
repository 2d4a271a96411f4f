"""Selector fixes: the root as module calls print it, several calls at once, ``.output`` of
OR-combined module selectors, and ``refresh_k`` labels that are no edit targets."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.errors import InvalidArgumentError, SelectorMatchError


class _Twice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        return self.b(self.a(x).relu()) + self.a(x)


def _trace():
    return tl.trace(_Twice(), torch.randn(2, 4))


def _picked(trace, selector) -> list[str]:
    return [op.label for op in trace if selector.matches(op)]


def test_the_root_as_module_calls_print_it():
    trace = _trace()
    assert trace.modules[0].name == "<root>:1"
    every = trace.labels
    assert _picked(trace, tl.module("<root>", call=1)) == every
    assert _picked(trace, tl.module("", call=1)) == every
    assert _picked(trace, tl.module("<root>")) == every
    assert _picked(trace, tl.module("", call=2)) == []


def test_call_takes_a_range_or_an_iterable():
    trace = _trace()
    assert [c.name for c in trace.module_calls("a")] == ["a:1", "a:2"]
    assert _picked(trace, tl.module("a", call=range(1, 3))) == ["linear_1", "linear_3"]
    assert _picked(trace, tl.module("a", call=[2])) == ["linear_3"]
    assert _picked(trace, tl.module("a", call=(1,)).output) == ["linear_1"]
    rec = tl.record(_Twice(), torch.randn(2, 4), save=tl.module("a", call={1, 2}).output)
    assert rec.labels == ["linear_1", "linear_3"]
    for bad in (-1, [], [1, "2"], "1", True):
        with pytest.raises(InvalidArgumentError) as info:
            tl.module("a", call=bad)
        assert info.value.code == "bad_selector"


def test_output_of_or_combined_module_selectors():
    trace = _trace()
    either = (tl.module("a", call=2) | tl.module("b")).output
    assert repr(either) == "(module('a', call=2).output | module('b').output)"
    rec = tl.record(_Twice(), torch.randn(2, 4), save=either)
    assert rec.labels == ["linear_2", "linear_3"]
    three = (tl.module("a") | tl.module("b") | tl.module("a", call=1)).output
    assert _picked(tl.trace(_Twice(), torch.randn(2, 4), save=three), three) == [
        "linear_1", "linear_2", "linear_3"]  # fmt: skip
    assert trace.labels  # the trace itself is untouched
    with pytest.raises(InvalidArgumentError) as info:
        (tl.module("a") | tl.func("relu")).output
    assert info.value.code == "bad_selector" and "func('relu')" in str(info.value)


class _WriteThroughView(nn.Module):
    def forward(self, x):
        a = x * 2
        a.view(-1).mul_(3)  # a write through another view: tl.trace notes refresh_1
        return a + 1


def test_refresh_labels_are_not_offered_as_edit_targets():
    model, x = _WriteThroughView(), torch.randn(2, 3)
    trace = tl.trace(model, x)
    assert "refresh_1" in trace.labels
    edit = {tl.label("refresh_1"): lambda t: t * 0}
    for run in (lambda: tl.trace(model, x, intervene=edit), lambda: trace.rerun(edit),
                lambda: tl.record(model, x, intervene=edit)):  # fmt: skip
        with pytest.raises(SelectorMatchError) as info:
            run()
        message = str(info.value)
        assert info.value.code == "no_match"
        assert "close names: refresh_1" not in message  # never itself as its close name
        assert "refresh_1 is a refresh op" in message and "not an edit target" in message


def test_the_root_calls_of_a_traced_method_as_they_print():
    from .test_generation import _kwargs, _llama

    trace = tl.trace(_llama().generate, kwargs=_kwargs(do_sample=False))
    calls = {c.name: c for c in trace.modules if c.address == ""}
    assert list(calls)[:3] == ["<root>:0", "<root>:1", "<root>:2"]
    assert (
        _picked(trace, tl.module("<root>", call=0)) == trace.labels == list(calls["<root>:0"].ops)
    )
    assert _picked(trace, tl.module("<root>", call=2)) == list(calls["<root>:2"].ops)


class _Blocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.block = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
        self.inner = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 3))

    def forward(self, x):
        return self.inner(self.block(x)) * 2


@pytest.mark.parametrize("stop", [tl.func("relu"), tl.module("block.1").output])
def test_stop_after_marks_the_halted_op_as_its_blocks_output_as_record_does(stop):
    model, x = _Blocks(), torch.randn(2, 3)
    save = tl.module("block").output
    trace = tl.trace(model, x, stop_after=stop, save=save)
    rec = tl.record(model, x, stop_after=stop, save=save)
    assert trace.labels == ["linear_1", "relu_1"] and rec.labels == ["relu_1"]
    assert trace.meta["halted_at"] == rec.meta["halted_at"] == "relu_1"
    assert trace.output is None and rec.output is None
    calls = {c.name: c for c in trace.modules}
    assert calls["block:1"].outputs == calls["block.1:1"].outputs == ("relu_1",)
    assert sorted(trace["relu_1"].returned_by) == sorted(rec["relu_1"].returned_by) == [
        ("block", 1, "Sequential"), ("block.1", 1, "ReLU")]  # fmt: skip
    assert torch.equal(trace["relu_1"].out, rec["relu_1"].out)
    assert torch.equal(trace["relu_1"].out, model.block(x))


def test_a_block_that_goes_on_after_the_halt_does_not_return_it():
    model, x = _Blocks(), torch.randn(2, 3)
    trace = tl.trace(model, x, stop_after=tl.label("relu_2"))
    calls = {c.name: c for c in trace.modules}
    assert calls["inner.1:1"].outputs == ("relu_2",)
    assert calls["inner:1"].outputs == ()  # it halted before its last layer ran
    assert trace.labels[-1] == "relu_2" and trace.output is None
    rec = tl.record(model, x, stop_after=tl.label("relu_2"), save=tl.module("inner.1").output)
    assert rec.labels == ["relu_2"] and rec["relu_2"].returned_by == (("inner.1", 1, "ReLU"),)


def test_a_halt_pending_inside_no_grad_puts_the_grad_mode_back():
    from .test_generation import _kwargs, _llama

    model, kwargs = _llama(), _kwargs(do_sample=False)
    stop = tl.module("lm_head", call=2).output  # generate runs under torch.no_grad()
    rec = tl.record(model.generate, kwargs=kwargs, stop_after=stop)
    assert torch.is_grad_enabled() and rec.meta["halted"]
    trace = tl.trace(model.generate, kwargs=kwargs, stop_after=stop)
    assert torch.is_grad_enabled() and trace.output is None
    assert trace.ops[-1].module_stack[:2] == (("", 2), ("lm_head", 2))
    assert trace.labels[-1] == rec.meta["halted_at"]


@pytest.mark.parametrize("name", ["", "<root>"])
def test_the_root_output_selects_the_same_op_in_trace_and_record(name):
    model, x = _Blocks(), torch.randn(2, 3)
    out = tl.module(name).output
    trace = tl.trace(model, x, save=out)
    rec = tl.record(model, x, save=out)
    assert [op.label for op in trace if op.has_out] == rec.labels == trace.output_labels
    assert rec.labels == ["mul_1"] and _picked(trace, out) == ["mul_1"]
    assert torch.equal(rec["mul_1"].out, model(x)) and torch.equal(trace["mul_1"].out, model(x))
    assert ("", 1, "_Blocks") in trace["mul_1"].returned_by
    assert ("", 1, "_Blocks") in rec["mul_1"].returned_by
    assert not _picked(trace, tl.module(name, call=2).output)
    edit = {out: lambda t: t * 0 + 5}  # an edit of what the model returns
    for run in (tl.trace, tl.record):
        assert torch.equal(run(model, x, intervene=edit).output, torch.full((2, 3), 5.0))
        halted = run(model, x, stop_after=out)
        assert halted.output is None and halted.meta["halted_at"] == "mul_1"
    assert tl.validate(model, x, intervene=edit)  # replay applies the edit as capture did


def test_the_root_output_of_a_traced_method_in_trace_and_record():
    from .test_generation import _kwargs, _llama

    model, kwargs = _llama(), _kwargs(do_sample=False)
    for call, kept in ((0, "whole"), (None, "every")):
        out = tl.module("<root>", call=call).output
        trace = tl.trace(model.generate, kwargs=kwargs, save=out)
        rec = tl.record(model.generate, kwargs=kwargs, save=out)
        assert [op.label for op in trace if op.has_out] == rec.labels
        if kept == "whole":  # <root>:0, the whole capture: what generate returned
            assert rec.labels == trace.output_labels
        else:  # and the logits each forward call (<root>:1...) returned
            assert len(rec.labels) == 4 and rec.labels[-1] == trace.output_labels[0]


class CallsItsLinearTwice(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x):
        return self.lin(self.lin(x).relu())


def test_module_by_type_keeps_to_the_call_asked_for():
    # type= with call=: the ops of that call of the innermost module, as .output picks
    # what that call returned (call= was ignored for type-only selectors)
    model, x = CallsItsLinearTwice(), torch.randn(1, 2)
    trace = tl.trace(model, x)
    second = tl.module(type=nn.Linear, call=2)
    assert [op.label for op in trace.ops if second.matches(op)] == ["linear_2"]
    assert tl.record(model, x, save=second).labels == ["linear_2"]
    assert tl.record(model, x, save=second.output).labels == ["linear_2"]
    assert tl.record(model, x, save=tl.module(type=nn.Linear)).labels == ["linear_1", "linear_2"]
