"""The benchmark floors (``benchmarks/floors.py``): each runs what it claims, and the replay
floor answers for what it replays."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

import torchlens as tl
from torchlens.replay import check_trace

try:
    from tests._benchmarks import load_benchmark
except ImportError:  # repository root not on sys.path (e.g. bare `pytest`)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _benchmarks import load_benchmark

floors = load_benchmark("floors")
count_floor, graph_floor, replay_floor = floors.count_floor, floors.graph_floor, floors.replay_floor
check_floor = floors.check_floor


def _model() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    layers = [nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(inplace=True), nn.Flatten()]
    model = nn.Sequential(*layers, nn.Linear(144, 5)).eval()
    return model, torch.randn(2, 3, 8, 8)


def test_graph_and_count_floors_return_the_forward_and_unwrap_the_model():
    model, x = _model()
    expected = model(x)
    assert torch.equal(graph_floor(model, (x,)), expected)
    assert torch.equal(count_floor(model, (x,)), expected)
    assert all("forward" not in module.__dict__ for module in model.modules())


def test_replay_floor_replays_every_call_and_leaves_the_saved_values_alone():
    model, x = _model()
    trace = tl.trace(model, x)
    before = {op.label: op.out.clone() for op in trace.ops}
    assert replay_floor(trace) == []  # the in-place ReLU ran on a copy
    assert all(torch.equal(trace[label].out, value) for label, value in before.items())
    assert check_trace(trace).state == "passed"


def test_replay_floor_names_a_value_its_call_does_not_reproduce():
    model, x = _model()
    trace = tl.trace(model, x)
    bad = trace["linear_1"].out + 1
    trace.store.set("linear_1", bad, bad._version)
    assert replay_floor(trace) == ["linear_1"]


def test_replay_floor_compares_what_the_replay_arm_compares():
    """Uninitialised memory is not compared (its replay holds other garbage), and the
    refreshes of a loop of channel writes are made once, as the arm makes them."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.CrossMapLRN2d(3)).eval()
    trace = tl.trace(model, torch.randn(1, 3, 10, 10))
    assert any(op.func_name == "resize_as_" for op in trace.ops)
    assert trace.store.written_over  # the channel loop's refreshes, kept as writes
    assert replay_floor(trace) == []
    assert check_trace(trace).state == "passed"


def test_check_floor_replays_and_probes_each_edge_that_needs_a_call_once():
    """Every edge of the conv net moves at the first probe, and the saved values stay as
    saved (the in-place ReLU's probe ran on a copy); an edge that ``x * 0`` silences is
    counted unmoved, so the floor really calls and compares."""
    model, x = _model()
    trace = tl.trace(model, x)
    before = {op.label: op.out.clone() for op in trace.ops}
    assert check_floor(trace) == ([], 0)
    assert all(torch.equal(trace[label].out, value) for label, value in before.items())
    silenced = tl.trace(lambda a, b: a * 0.0 + b, (torch.randn(3), torch.randn(3)))
    assert check_floor(silenced) == ([], 1)
