"""A forward that raises inside tl.trace: the model's error, carrying the partial trace."""

from __future__ import annotations

import traceback

import pytest
import torch
from torch import nn

import torchlens as tl

from ._frames import in_torchlens


class Broken(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(3, 2)  # wrong in_features: the second linear raises

    def forward(self, x):
        h = self.a(x).relu()
        return self.b(h)


class PythonError(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x):
        h = self.a(x).sigmoid()
        if h.shape[0] == 2:
            raise ValueError("batches of two are not supported")
        return h


def test_model_error_carries_the_ops_before_the_failing_call():
    model, x = Broken(), torch.randn(2, 4)
    with pytest.raises(RuntimeError) as caught:
        tl.trace(model, x)
    err = caught.value
    assert type(err) is RuntimeError  # the model's own error, not wrapped
    partial = err.partial_trace
    assert partial.labels == ["linear_1", "relu_1"]
    assert partial.meta["partial"] is True
    assert (partial.meta["failed_call"], partial.meta["failed_in"]) == ("linear_2", "b:1")
    assert partial.meta["error"].startswith("RuntimeError: mat1 and mat2")
    assert torch.equal(partial["relu_1"].out, model.a(x).relu())
    assert partial.output is None and partial.output_labels == []
    assert [m.name for m in partial.modules] == ["<root>:1", "a:1", "b:1"]
    last = traceback.extract_tb(err.__traceback__)[-1]
    assert not in_torchlens(last.filename)  # the traceback still ends in model code (torch)


def test_python_error_names_the_module_call_but_no_torch_call():
    with pytest.raises(ValueError) as caught:
        tl.trace(PythonError(), torch.randn(2, 4), source=True)
    partial = caught.value.partial_trace
    assert partial.labels == ["linear_1", "sigmoid_1"]
    assert partial.meta["failed_call"] is None and partial.meta["failed_in"] == ""
    assert partial["sigmoid_1"].source.function == "forward"  # source= applies too


class Twice(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = PythonError()

    def forward(self, x):
        return self.inner(self.inner(x)[:2])  # the second call gets a batch of two


def test_python_error_in_a_submodule_names_its_call():
    with pytest.raises(ValueError) as caught:
        tl.trace(Twice(), torch.randn(3, 4))
    partial = caught.value.partial_trace
    assert partial.meta["failed_call"] is None and partial.meta["failed_in"] == "inner:2"
    assert partial.labels[-1] == "sigmoid_2"


def test_a_finished_trace_is_not_partial():
    trace = tl.trace(PythonError(), torch.randn(3, 4))
    assert "partial" not in trace.meta and "failed_call" not in trace.meta


def test_a_streamed_capture_gives_a_readable_partial_trace(tmp_path):
    model, x = Broken(), torch.randn(2, 4)
    with pytest.raises(RuntimeError) as caught:
        tl.trace(model, x, stream_to=tmp_path / "run")
    partial = caught.value.partial_trace
    assert torch.equal(partial["relu_1"].out, model.a(x).relu())
    assert (tmp_path / "run" / "INCOMPLETE").exists()  # the directory says it is unfinished


@pytest.mark.parametrize("model", [Broken, Twice], ids=["torch_call", "python_in_submodule"])
def test_dropping_the_error_frees_the_partial_trace(model):
    import gc
    import weakref

    gc.disable()  # freed by reference counting alone: no cycle through the error
    try:
        with pytest.raises((RuntimeError, ValueError)) as caught:
            tl.trace(model(), torch.randn(3, 4))
        partial = weakref.ref(caught.value.partial_trace)
        value = weakref.ref(caught.value.partial_trace["linear_1"].out)
        del caught
        assert partial() is None and value() is None
    finally:
        gc.enable()
