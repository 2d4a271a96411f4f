"""Mistakes in what is handed to tl.trace, and errors the model itself raises while traced."""

from __future__ import annotations

import traceback

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.errors import InvalidArgumentError, TorchLensError, UnsupportedModelError

from ._frames import in_torchlens


class WrongChannels(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3))
        self.scale = nn.Parameter(torch.ones(5))

    def forward(self, x):
        x = torch.relu(x)
        return self.stem(x)


class WrongShapeHere(nn.Module):
    def forward(self, x):
        y = torch.relu(x)
        return torch.matmul(y, y)  # (2, 3) @ (2, 3): fails on this line of this file


def test_the_models_error_keeps_its_type_and_gets_a_note():
    with pytest.raises(RuntimeError) as info:
        tl.trace(WrongChannels(), torch.randn(1, 4, 8, 8))
    err = info.value
    assert type(err) is RuntimeError and not isinstance(err, TorchLensError)
    assert "channels" in str(err)
    if hasattr(err, "add_note"):  # Python 3.11+
        (note,) = err.__notes__
        assert "conv2d_1" in note and "stem.0" in note


def test_the_last_traceback_frame_is_the_models_line():
    with pytest.raises(RuntimeError) as info:
        tl.trace(WrongShapeHere(), torch.randn(2, 3))
    last = traceback.extract_tb(info.value.__traceback__)[-1]
    assert last.filename == __file__
    assert last.name == "forward" and "torch.matmul" in last.line
    if hasattr(info.value, "add_note"):
        assert "matmul_1" in info.value.__notes__[0]
        assert "model's own forward" in info.value.__notes__[0]
    frames = traceback.extract_tb(info.value.__traceback__)
    assert not any(in_torchlens(f.filename) and f.filename.endswith("mode.py") for f in frames)


def test_record_reports_the_models_error_the_same_way():
    with pytest.raises(RuntimeError) as info:
        tl.record(WrongChannels(), torch.randn(1, 4, 8, 8), save=tl.func("relu"))
    frames = traceback.extract_tb(info.value.__traceback__)
    assert frames[1].name == "record"  # the call the user made; nothing of ours below it
    assert not any(in_torchlens(f.filename) for f in frames[2:])
    if hasattr(info.value, "add_note"):
        (note,) = info.value.__notes__
        assert "conv2d_1" in note and "stem.0" in note
    with pytest.raises(RuntimeError) as info:
        tl.record(WrongShapeHere(), torch.randn(2, 3), save=tl.func("relu"))
    last = traceback.extract_tb(info.value.__traceback__)[-1]
    assert (last.filename, last.name) == (__file__, "forward")


class NormWrongWidth(nn.Module):
    """F.layer_norm is Python calling torch.layer_norm: the error passes two torch calls."""

    def forward(self, x):
        return nn.functional.layer_norm(torch.relu(x), (5,))


def test_the_models_error_is_noted_once_and_capture_is_torn_down():
    with pytest.raises(RuntimeError) as info:
        tl.trace(NormWrongWidth(), torch.randn(2, 3))
    if hasattr(info.value, "add_note"):
        (note,) = info.value.__notes__
        assert "layer_norm_1" in note
    frames = traceback.extract_tb(info.value.__traceback__)
    assert frames[-1].name == "layer_norm" and "functional" in frames[-1].filename
    assert not any(in_torchlens(f.filename) for f in frames[2:])
    assert tl.trace(nn.ReLU(), torch.randn(2)).labels == ["relu_1"]  # nothing left installed


def test_a_module_class_instead_of_an_instance_is_refused():
    for run in (tl.trace, tl.validate, tl.record):
        with pytest.raises(UnsupportedModelError) as info:
            run(nn.Linear, torch.randn(2, 4))
        assert info.value.code == "module_class"
        assert "tl.trace(Linear(...), x)" in str(info.value)


def test_intervene_functions_of_the_tensor_alone_work():
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    x = torch.randn(2, 4)
    trace = tl.trace(model, x, intervene={tl.label("relu_1"): lambda t: t * 0})
    assert torch.equal(trace.output, torch.zeros(2, 3))
    edit = tl.Intervention(lambda t: t + 1, keep_original=True)
    trace = tl.trace(model, x, intervene={tl.label("relu_1"): edit})
    assert torch.equal(trace.output, trace.store.get("relu_1#original") + 1)
    recording = tl.record(model, x, intervene={tl.func("relu"): lambda t: t * 0})
    assert torch.equal(recording["relu_1"].out, torch.zeros(2, 3))
    assert tl.validate(model, x, intervene={tl.label("relu_1"): lambda t: t * 0})


def test_intervene_functions_of_neither_form_are_refused_up_front():
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    for bad in (lambda: 0, lambda t, op, extra: t):
        with pytest.raises(InvalidArgumentError) as info:
            tl.trace(model, torch.randn(2, 4), intervene={tl.func("relu"): bad})
        assert info.value.code == "bad_intervene"
        assert "fn(tensor, op)" in str(info.value)
