"""Selectors: matching, algebra, errors, and ``tl.trace(save=...)``."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchlens as tl
from tests._tiny_llms import build
from torchlens.errors import InvalidArgumentError, PayloadUnavailableError, SelectorMatchError


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return torch.relu(self.fc(x))


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Block() for _ in range(3)])
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        x = self.layers[0](x)  # the first block runs twice
        a, b = x.split(2, dim=-1)
        return self.head(x) + a.sum() + b.sum()


@pytest.fixture(scope="module")
def trace():
    torch.manual_seed(0)
    return tl.trace(Stack().eval(), torch.randn(2, 4))


def _selected(trace, selector):
    return [op.label for op in trace if selector.matches(op)]


def test_func_selects_by_function_name(trace):
    assert _selected(trace, tl.func("relu")) == ["relu_1", "relu_2", "relu_3", "relu_4"]
    assert _selected(trace, tl.func("sum", "split")) == ["split_1:0", "split_1:1", "sum_1", "sum_2"]


def test_module_selects_ops_inside_a_call_nested_included(trace):
    assert _selected(trace, tl.module("layers.1")) == ["linear_2", "relu_2"]
    assert _selected(trace, tl.module("layers.1.fc")) == ["linear_2"]
    assert _selected(trace, tl.module("layers.0", call=2)) == ["linear_4", "relu_4"]
    assert _selected(trace, tl.module("layers.*")) == [
        f"{f}_{i}" for i in range(1, 5) for f in ("linear", "relu")
    ]
    assert len(_selected(trace, tl.module(""))) == len(trace)


def test_label_selects_ops_and_all_outputs_of_a_call(trace):
    assert _selected(trace, tl.label("linear_2", "relu_4")) == ["linear_2", "relu_4"]
    assert _selected(trace, tl.label("split_1")) == ["split_1:0", "split_1:1"]
    assert _selected(trace, tl.label("split_1:1")) == ["split_1:1"]


def test_algebra_and_plain_callables(trace):
    in_layers = tl.module("layers.*")
    assert _selected(trace, tl.func("relu") & ~tl.module("layers.0")) == ["relu_2", "relu_3"]
    assert _selected(trace, tl.label("sum_1") | tl.label("sum_2")) == ["sum_1", "sum_2"]
    wide = lambda op: op.shape[-1:] == (2,)  # noqa: E731
    assert _selected(trace, tl.func("linear") & wide) == ["linear_5"]
    assert _selected(trace, wide & tl.func("linear")) == ["linear_5"]
    assert _selected(trace, wide | tl.func("relu")) == _selected(
        trace, tl.where(wide) | tl.func("relu")
    )
    assert set(_selected(trace, ~in_layers)) == set(trace.labels) - set(_selected(trace, in_layers))


def test_static_and_func_names_facts():
    assert (tl.func("relu") & tl.module("a")).static
    assert not (tl.func("relu") & tl.label("relu_1")).static
    assert (tl.func("relu") & tl.where(bool)).func_names == {"relu"}
    assert (tl.func("relu") | tl.label("linear_2", "split_1:0")).func_names == {
        "relu",
        "linear",
        "split",
    }
    assert (tl.func("relu") | tl.module("a")).func_names is None
    assert (~tl.func("relu")).func_names is None


@pytest.mark.parametrize("bad", ["relu", 3, None])
def test_non_selectors_are_refused(bad):
    with pytest.raises(InvalidArgumentError) as err:
        tl.func("relu") & bad
    assert err.value.code == "bad_selector"


def test_constructors_check_their_arguments():
    for make in (
        lambda: tl.func(),
        lambda: tl.label(""),
        lambda: tl.module(3),
        lambda: tl.where(1),
    ):
        with pytest.raises(InvalidArgumentError) as err:
            make()
        assert err.value.code == "bad_selector"


def test_save_keeps_values_only_for_matches_and_the_whole_graph():
    torch.manual_seed(0)
    model, x = Stack().eval(), torch.randn(2, 4)
    full = tl.trace(model, x)
    sparse = tl.trace(model, x, save=tl.func("relu") | tl.module("head"))
    assert sparse.labels == full.labels
    assert [op.parents for op in sparse] == [op.parents for op in full]
    kept = [op.label for op in sparse if op.has_out]
    assert kept == ["relu_1", "relu_2", "relu_3", "relu_4", "linear_5"]
    for label in kept:
        assert torch.equal(sparse[label].out, full[label].out)
    with pytest.raises(PayloadUnavailableError) as err:
        sparse["linear_1"].out
    assert err.value.code == "not_saved"
    assert torch.equal(sparse.output, full.output)


def test_selector_matching_nothing_names_close_names():
    model, x = Stack().eval(), torch.randn(2, 4)
    with pytest.raises(SelectorMatchError) as err:
        tl.trace(model, x, save=tl.func("rellu"))
    assert err.value.code == "no_match" and "relu" in str(err.value)
    with pytest.raises(SelectorMatchError) as err:
        tl.record(model, x, save=tl.module("layer.1"))
    assert "layers.1" in str(err.value)
    with pytest.raises(SelectorMatchError) as err:
        tl.trace(model, x, save=tl.label("linear_9"))
    assert "linear_" in str(err.value)


def test_save_conflicts_with_structure_only():
    with pytest.raises(InvalidArgumentError) as err:
        tl.trace(Stack(), torch.randn(2, 4), structure_only=True, save=tl.func("relu"))
    assert err.value.code == "conflicting_options"


def test_call_labels_fact():
    """The calls a selector can match at all: ``tl.record`` skips every other call of a
    matching function without building a view of it."""
    assert tl.label("linear_3", "split_1:0").call_labels == {"linear_3", "split_1"}
    assert (tl.label("linear_1", "relu_2") & tl.func("linear")).call_labels == {
        "linear_1",
        "relu_2",
    }
    assert (tl.label("linear_1") | tl.label("relu_1")).call_labels == {"linear_1", "relu_1"}
    assert (tl.label("linear_1") | tl.func("relu")).call_labels is None
    assert (~tl.label("linear_1")).call_labels is None
    assert tl.func("linear").call_labels is None


def test_record_by_label_keeps_exactly_the_named_outputs():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4), nn.ReLU())
    x = torch.randn(2, 4)
    rec = tl.record(model, x, save=tl.label("linear_2", "relu_1"))
    trace = tl.trace(model, x)
    assert rec.labels == ["relu_1", "linear_2"]
    for label in rec.labels:
        assert torch.equal(rec[label].out, trace[label].out)


def test_a_module_selector_on_a_callable_that_is_no_module_says_how_to_trace_modules():
    model = nn.Sequential(nn.Linear(2, 2))
    with pytest.raises(SelectorMatchError) as caught:
        tl.trace(lambda x: x * 2, torch.randn(1, 2), save=tl.module("0"))
    assert caught.value.code == "no_match"
    assert "no module call was recorded" in str(caught.value)
    assert "wrap the call in an nn.Module" in str(caught.value)
    # a function calling a module: the module is recorded under its class name, which the
    # hint offers; root= names it as the module itself would
    with pytest.raises(SelectorMatchError) as caught:
        tl.trace(lambda x: model(x), torch.randn(1, 2), save=tl.module("0"))
    assert "close names: Sequential.0" in str(caught.value)
    rooted = tl.trace(lambda x: model(x), torch.randn(1, 2), root=model, save=tl.module("0"))
    assert rooted["linear_1"].has_out and rooted["linear_1"].module == "0"
    with pytest.raises(SelectorMatchError) as caught:  # a module was traced: no such hint
        tl.trace(model, torch.randn(1, 2), save=tl.module("1"))
    assert "no module call was recorded" not in str(caught.value)


def test_star_crosses_dots_and_a_plus_segment_matches_one_name(trace):
    """``layers.*`` is every module below ``layers``; ``layers.+`` its direct children."""
    star = [m.name for m in trace.module_calls("layers.*")]
    assert star == ["layers.0:1", "layers.0.fc:1", "layers.1:1", "layers.1.fc:1",
                    "layers.2:1", "layers.2.fc:1", "layers.0:2", "layers.0.fc:2"]  # fmt: skip
    plus = [m.name for m in trace.module_calls("layers.+")]
    assert plus == ["layers.0:1", "layers.1:1", "layers.2:1", "layers.0:2"]
    assert [m.name for m in trace.module_calls("layers.+.fc")] == [
        "layers.0.fc:1", "layers.1.fc:1", "layers.2.fc:1", "layers.0.fc:2"
    ]  # fmt: skip
    assert [m.name for m in trace.module_calls("+")] == ["head:1"]  # the ModuleList: no call
    # the ops inside are the same either way; what the calls returned is not
    assert _selected(trace, tl.module("layers.+")) == _selected(trace, tl.module("layers.*"))
    assert _selected(trace, tl.module("layers.+").output) == [
        "relu_1",
        "relu_2",
        "relu_3",
        "relu_4",
    ]
    assert _selected(trace, tl.module("layers.*").output) == [
        f"{f}_{i}" for i in range(1, 5) for f in ("linear", "relu")
    ]
    assert _selected(trace, tl.module("layers.+.fc").output) == [f"linear_{i}" for i in range(1, 5)]
    assert "layers.0.fc:1" not in trace.summary(by="module", module="layers.+")


def test_a_plus_inside_a_name_is_a_plain_character():
    class Keys(nn.Module):
        def __init__(self):
            super().__init__()
            self.parts = nn.ModuleDict({"a+b": nn.Linear(2, 2), "+": nn.Linear(2, 2)})

        def forward(self, x):
            return self.parts["+"](self.parts["a+b"](x))

    trace = tl.trace(Keys(), torch.randn(1, 2))
    assert [m.name for m in trace.module_calls("parts.a+b")] == ["parts.a+b:1"]
    assert [m.name for m in trace.module_calls("parts.[+]")] == ["parts.+:1"]
    assert [m.name for m in trace.module_calls("parts.+")] == ["parts.a+b:1", "parts.+:1"]


@pytest.mark.parametrize("pattern", ["layers..0", "layers.", ".layers", "layers.0:2"])
def test_malformed_module_patterns_are_typed_errors(trace, pattern):
    with pytest.raises(InvalidArgumentError) as err:
        tl.module(pattern)
    assert err.value.code == "bad_selector"
    if ":" in pattern:
        assert "tl.module('layers.0', call=2)" in str(err.value)
        assert trace.module_calls(pattern)[0].name == "layers.0:2"  # a call, where calls are
    else:
        with pytest.raises(InvalidArgumentError):
            trace.module_calls(pattern)


def test_gpt2_blocks_are_transformer_h_plus():
    model = build(
        "GPT2LMHeadModel", "GPT2Config", n_layer=2, n_embd=32, n_head=2, n_positions=32,
        vocab_size=50, bos_token_id=0, eos_token_id=0, attn_implementation="sdpa",
    )  # fmt: skip
    trace = tl.trace(model, torch.randint(0, 50, (1, 8)))
    nested = trace.module_calls("transformer.h.*")
    assert len(nested) == 24  # each block, and the 11 calls inside each
    star = [op.label for op in trace if tl.module("transformer.h.*").output.matches(op)]
    assert len(star) == 20  # mlp and mlp.dropout (...) return the same op
    assert [m.name for m in trace.module_calls("transformer.h.+")] == [
        "transformer.h.0:1", "transformer.h.1:1"
    ]  # fmt: skip
    outputs = [op.label for op in trace if tl.module("transformer.h.+").output.matches(op)]
    assert outputs == [m.outputs[0] for m in trace.module_calls("transformer.h.+")]
    assert len(outputs) == 2
