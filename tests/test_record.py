"""Sparse recording: ``tl.record`` keeps the same values and labels as ``tl.trace``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn.modules import module as module_hooks
from torch.overrides import _get_current_function_mode_stack

import torchlens as tl
from torchlens.errors import LookupFailedError, ReentrantCaptureError, SelectorMatchError

try:
    from tests.models import zoo_params
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from models import zoo_params

EVERY_OP = tl.where(lambda op: True)


def _run(case, fn, **kw):
    model = case.make_model()
    args, kwargs = case.make_inputs()
    torch.manual_seed(0)
    return fn(model, args, kwargs, **kw)


@pytest.mark.parametrize("case", zoo_params())
def test_record_equals_trace_on_the_zoo(case):
    trace = _run(case, tl.trace)
    if not len(trace):
        with pytest.raises(SelectorMatchError):
            _run(case, tl.record, save=EVERY_OP)
        return
    rec = _run(case, tl.record, save=EVERY_OP)
    ops = list(trace)  # refresh ops too: a write through a view is counted alike
    assert rec.labels == [op.label for op in ops]
    for op in ops:
        view = rec[op.label]
        assert (view.func_name, view.module_stack, view.shape, view.dtype) == (
            op.func_name,
            op.module_stack,
            op.shape,
            op.dtype,
        )
        if op.has_out and not op.func_name.startswith("empty"):  # empty(): garbage values
            torch.testing.assert_close(view.out, op.out, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("case", zoo_params("multi_output") + zoo_params("attention"))
def test_a_sparse_selector_keeps_the_same_ops_as_trace_save(case):
    trace = _run(case, tl.trace)
    names = sorted({op.func_name for op in trace})[::3]
    selector = tl.func(*names) | tl.label(trace.labels[-1])
    sparse = _run(case, tl.trace, save=selector)
    rec = _run(case, tl.record, save=selector)
    assert rec.labels == [op.label for op in sparse if op.has_out]
    for view in rec:
        torch.testing.assert_close(view.out, sparse[view.label].out, rtol=0, atol=0)


class WritesAfter(nn.Module):
    def forward(self, x):
        y = torch.relu(x)
        y.add_(10)  # later in-place write into the kept value
        return y * 2


def test_kept_value_is_the_value_at_the_time():
    x = torch.randn(3, 4)
    rec = tl.record(WritesAfter(), x, save=tl.func("relu", "add_"))
    assert torch.equal(rec["relu_1"].out, torch.relu(x))
    assert torch.equal(rec["add__1"].out, torch.relu(x) + 10)
    rec.output.mul_(0)  # the caller edits the output in place afterwards
    assert torch.equal(rec["add__1"].out, torch.relu(x) + 10)


def test_values_aliasing_buffers_survive_the_next_forward():
    model = nn.BatchNorm1d(3).train()
    rec = tl.record(model, torch.randn(4, 3), save=tl.func("add_"))
    model(torch.randn(4, 3))  # bumps num_batches_tracked in place again
    assert rec["add__1"].out.item() == 1


class TransposesItsWeight(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(3, 4))
        self.head = nn.Linear(3, 2, bias=False)  # (a None among the parameters)

    def forward(self, x):
        return self.head(x @ self.w.t())


def test_values_aliasing_parameters_survive_an_optimizer_step():
    model = TransposesItsWeight()
    rec = tl.record(model, torch.randn(2, 4), save=tl.func("t"))
    before = model.w.detach().t().clone()
    with torch.no_grad():
        model.w.add_(1)  # an optimizer step writes the weight in place
    assert torch.equal(rec["t_1"].out, before)


def test_recording_api():
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    x = torch.randn(2, 4)
    rec = tl.record(model, x, save=tl.module("1") | tl.module("2"))
    assert rec.labels == ["relu_1", "linear_2"] and len(rec) == 2 and "relu_1" in rec
    assert rec["linear_2"].module == "2" and rec["linear_2"].address == "2:1"
    assert rec["relu_1"].shape == (2, 3) and rec.meta["n_ops"] == 3
    assert torch.equal(rec.output, model(x)) and not rec.halted
    assert set(rec.activations) == {"relu_1", "linear_2"}
    with pytest.raises(LookupFailedError) as err:
        rec["relu_2"]
    assert "relu_1" in str(err.value)
    nothing = tl.record(model, x)
    assert len(nothing) == 0 and torch.equal(nothing.output, model(x))


def test_record_leaves_nothing_installed():
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    tl.record(model, torch.randn(2, 4), save=tl.func("relu"))
    assert not _get_current_function_mode_stack()
    for module in model.modules():
        assert not module._forward_hooks and not module._forward_pre_hooks
    assert not module_hooks._global_forward_hooks
    assert not module_hooks._global_forward_pre_hooks


class TracesInside(nn.Module):
    def forward(self, x):
        return tl.trace(nn.ReLU(), x).output


def test_capture_inside_record_is_refused():
    with pytest.raises(ReentrantCaptureError):
        tl.record(TracesInside(), torch.randn(2), save=tl.func("relu"))
    assert not _get_current_function_mode_stack()


def test_garbage_collector_is_paused_during_a_recording_and_restored_after():
    import gc

    seen = []

    def probe(x):
        seen.append(gc.isenabled())
        return x * 2

    def fails(x):
        raise ValueError("boom")

    assert gc.isenabled()
    tl.record(probe, torch.randn(2))
    with pytest.raises(ValueError, match="boom"):
        tl.record(fails, torch.randn(2))
    assert seen == [False] and gc.isenabled()


class ReturnsOutOfOrder(nn.Module):
    def forward(self, x):
        a, b = x.relu(), x.sigmoid()
        return b, a


def test_module_outputs_are_kept_in_execution_order_as_trace_lists_them():
    model = nn.Sequential(ReturnsOutOfOrder())
    x = torch.randn(3)
    recording = tl.record(model, x, save=tl.module("0").output)
    trace = tl.trace(model, x, save=tl.module("0").output)
    assert recording.labels == [op.label for op in trace if op.has_out] == ["relu_1", "sigmoid_1"]


@pytest.mark.parametrize(
    "save", [tl.label("linear_1"), tl.module("0").output], ids=["by label", "module output"]
)
def test_a_dropped_recording_frees_its_values_without_the_garbage_collector(save):
    # a reference cycle through the recording's mode kept every kept value alive until the
    # next collection: tl.extract then held several batches' activations at once
    import gc
    import weakref

    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    was = gc.isenabled()
    gc.disable()
    try:
        rec = tl.record(model, torch.randn(2, 4), save=save)
        kept = weakref.ref(rec.ops[0].out)
        del rec
        assert kept() is None
    finally:
        if was:
            gc.enable()
