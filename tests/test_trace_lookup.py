"""Finding things in a trace: module calls by address, helpful misses, module types, summaries."""

from __future__ import annotations

import gc

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.errors import LookupFailedError, PayloadUnavailableError
from torchlens.trace import lookup_of, lookup_while


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)

    def forward(self, x):
        return torch.relu(self.norm(self.fc(x)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(2)])
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        x = self.blocks[0](x)  # blocks.0 runs twice
        return self.head(x)


@pytest.fixture(scope="module")
def trace():
    torch.manual_seed(0)
    return tl.trace(Net().eval(), torch.randn(2, 4))


def test_modules_by_address_and_call(trace):
    head = trace.modules["head"]
    assert (head.address, head.call_index, head.module_type) == ("head", 1, "Linear")
    assert head.outputs == (trace.output_labels[0],)
    second = trace.modules["blocks.0:2"]
    assert (second.address, second.call_index) == ("blocks.0", 2)
    assert trace.modules["blocks.0.fc:1"].module_type == "Linear"
    assert trace.modules[""].module_type == "Net"
    assert trace.modules["<root>:1"] is trace.modules[0]
    assert [m.name for m in trace.modules[1:3]] == ["blocks.0:1", "blocks.0.fc:1"]


def test_modules_lookup_errors_say_what_to_do(trace):
    with pytest.raises(LookupFailedError) as info:
        trace.modules["blocks.0"]  # called twice: which call?
    assert info.value.code == "ambiguous_module"
    assert "blocks.0:2" in str(info.value) and "module_calls('blocks.0')" in str(info.value)
    with pytest.raises(LookupFailedError) as info:
        trace.modules["blocks.00"]
    assert info.value.code == "not_found" and "blocks.0" in str(info.value)


def test_module_calls_take_globs_like_tl_module(trace):
    assert [m.name for m in trace.module_calls("blocks.0")] == ["blocks.0:1", "blocks.0:2"]
    assert [m.name for m in trace.module_calls("blocks.*.fc")] == [
        "blocks.0.fc:1",
        "blocks.1.fc:1",
        "blocks.0.fc:2",
    ]
    assert [m.name for m in trace.module_calls("blocks.0:2")] == ["blocks.0:2"]
    with pytest.raises(LookupFailedError) as info:
        trace.module_calls("blocks.*.conv")
    assert info.value.code == "not_found"


def test_a_module_address_as_op_label_says_how_to_reach_the_module(trace):
    with pytest.raises(LookupFailedError) as info:
        trace["blocks.0"]
    message = str(info.value)
    assert "module address" in message
    assert "trace.modules['blocks.0']" in message and "tl.module('blocks.0')" in message
    assert "weight" not in message  # no parameter labels offered as look-alikes


def test_ops_know_their_module_type(trace):
    assert trace["linear_1"].module_type == "Linear"
    assert trace["layer_norm_1"].module_type == "LayerNorm"
    assert trace["relu_1"].module_type == "Block"


def test_where_predicates_see_the_module_type():
    model = Net().eval()
    x = torch.randn(2, 4)
    in_norm = tl.where(lambda op: op.module_type == "LayerNorm")
    traced = tl.trace(model, x, save=in_norm)
    assert [op.label for op in traced if op.has_out] == [
        "layer_norm_1",
        "layer_norm_2",
        "layer_norm_3",
    ]
    seen = []
    spy = tl.where(lambda op: seen.append(op.module_type) or True)
    tl.trace(model, x, intervene={spy: lambda t, op: t})
    assert seen[:3] == ["Linear", "LayerNorm", "Block"]
    recording = tl.record(model, x, save=in_norm)
    assert recording.labels == ["layer_norm_1", "layer_norm_2", "layer_norm_3"]
    assert recording["layer_norm_1"].module_type == "LayerNorm"


def test_module_type_survives_save_and_load(trace, tmp_path):
    loaded = tl.load(trace.save(tmp_path / "t"))
    assert [op.module_type for op in loaded] == [op.module_type for op in trace]


class Long(nn.Module):
    def forward(self, x):
        for _ in range(150):
            x = torch.sin(x)
        return x


def test_a_long_trace_prints_head_and_tail_with_a_count():
    trace = tl.trace(Long(), torch.randn(3))
    text = str(trace)
    assert len(text.splitlines()) < 50
    assert "sin_1 " in text and "sin_150 " in text and "sin_75 " not in text
    assert "110 more ops" in text and "max_rows=None" in text
    full = trace.summary(max_rows=None)
    assert "sin_75 " in full and len(full.splitlines()) > 150


def test_summary_filters_by_selector_module_and_rows(trace):
    relus = trace.summary(tl.func("relu"))
    assert "relu_1" in relus and "linear_1" not in relus and "showing 3 ops" in relus
    head = trace.summary(module="head")
    assert "linear_4" in head and "relu_1" not in head
    both = trace.summary(tl.func("linear"), module="blocks.*")
    assert [line.split()[0] for line in both.splitlines()[3:-1]] == [
        "linear_1",
        "linear_2",
        "linear_3",
    ]
    few = trace.summary(max_rows=2)
    assert "linear_1" in few and "linear_4" in few and "more ops" in few


def double(x):
    return torch.relu(x) * 2


def test_module_type_at_the_root_is_the_callables_name():
    trace = tl.trace(double, torch.randn(3))
    assert trace.modules[""].module_type == "double"
    assert [op.module_type for op in trace] == ["double", "double"]
    by_type = tl.where(lambda op: op.module_type == "double")
    recording = tl.record(double, torch.randn(3), save=by_type)
    assert [op.module_type for op in recording] == ["double", "double"]
    assert [op.has_out for op in tl.trace(double, torch.randn(3), save=by_type)] == [True, True]


def test_printed_trace_names_ops_that_ran_in_training_mode():
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4), torch.nn.Dropout(0.2)
    )
    trained = str(tl.trace(model.train(), torch.randn(3, 4)))
    assert "traced in training mode: 1 batch_norm, 1 dropout op(s)" in trained
    assert "model.eval()" in trained
    assert "training mode" not in str(tl.trace(model.eval(), torch.randn(3, 4)))


def test_a_records_store_is_where_its_value_is_read():
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    trace = tl.trace(model, torch.randn(2, 4))
    op, source = trace["relu_1"], trace.sources[0]
    assert op.store is trace.store and source.store is trace.store
    assert op.grad_store is None  # no save_grads=True
    kept = op.out
    op.store = None  # detached from its store, the op has no value to give
    assert not op.has_out
    with pytest.raises(PayloadUnavailableError) as err:
        op.out
    assert err.value.code == "not_saved"
    op.store = trace.store
    assert torch.equal(op.out, kept)


def test_grad_store_is_attached_by_save_grads():
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    trace = tl.trace(model, torch.randn(2, 4), save_grads=True)
    assert trace["relu_1"].grad_store is not None
    assert trace.sources[0].grad_store is trace["relu_1"].grad_store


def test_lookup_of_finds_parents_while_the_trace_lives_or_an_edit_runs():
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    trace = tl.trace(model, torch.randn(2, 4))
    op = trace["relu_1"]
    assert lookup_of(op)("linear_1") is trace["linear_1"]
    del trace
    gc.collect()
    assert lookup_of(op) is None  # the op of a trace that is gone
    seen = {"linear_1": "the ops so far"}.get
    with pytest.raises(RuntimeError):
        with lookup_while(op, seen):
            assert lookup_of(op) is seen
            raise RuntimeError("the edit failed")
    assert lookup_of(op) is None  # removed on every exit
