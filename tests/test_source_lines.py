"""op.source: the model line behind each op, recorded only with tl.trace(source=True)."""

from __future__ import annotations

import inspect

import pytest
import torch
from torch import nn

import torchlens as tl
import torchlens.capture.api as capture_api
from torchlens.errors import PayloadUnavailableError


def _scaled(x):
    return x * 2  # HELPER LINE


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)  # FC LINE
        first, second = h.split(2, dim=1)  # SPLIT LINE
        return _scaled(first) + second


def _line(obj, marker: str) -> int:
    lines, start = inspect.getsourcelines(obj)
    return start + next(i for i, text in enumerate(lines) if marker in text)


def test_each_op_names_its_file_line_and_function():
    trace = tl.trace(Model(), torch.randn(2, 4), source=True)
    fc = trace["linear_1"].source
    assert (fc.file, fc.line, fc.function) == (__file__, _line(Model, "FC LINE"), "forward")
    split_line = _line(Model, "SPLIT LINE")
    assert trace["split_1:0"].source.line == trace["split_1:1"].source.line == split_line
    helper = trace["mul_1"].source
    assert (helper.line, helper.function) == (_line(_scaled, "HELPER LINE"), "_scaled")
    assert str(helper) == f"{__file__}:{helper.line} in _scaled"


def test_off_by_default_with_a_typed_error_and_no_hook():
    def refuse():
        raise AssertionError("the source hook must not be built without source=True")

    original = capture_api.make_source_hook
    capture_api.make_source_hook = refuse
    try:
        trace = tl.trace(Model(), torch.randn(2, 4))
    finally:
        capture_api.make_source_hook = original
    assert all("source" not in op.meta for op in trace)
    with pytest.raises(PayloadUnavailableError) as err:
        trace["linear_1"].source
    assert err.value.code == "source_not_captured" and "source=True" in str(err.value)


def test_source_survives_save_and_load(tmp_path):
    trace = tl.trace(Model(), torch.randn(2, 4), source=True)
    loaded = tl.load(trace.save(tmp_path / "t"))
    assert [op.source for op in loaded] == [op.source for op in trace]
