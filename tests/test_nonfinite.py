"""tl.find_nonfinite: the first op whose output holds a NaN or an infinity."""

from __future__ import annotations

import inspect

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.errors import InvalidArgumentError

BAD_FUNCS = {"log": "log", "zero_div": "div", "exp_overflow": "exp"}


def _bad(kind: str, h: torch.Tensor) -> torch.Tensor:
    if kind == "log":
        return torch.log(h - 100.0)  # BAD LINE log
    if kind == "zero_div":
        return (h * 0) / (h * 0)  # BAD LINE zero_div
    return torch.exp(h.abs() + 1000.0)  # BAD LINE exp_overflow


class Block(nn.Module):
    def __init__(self, kind: str | None) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.kind = kind

    def forward(self, x):
        h = torch.tanh(self.fc(x))
        return _bad(self.kind, h) if self.kind else h


class Net(nn.Module):
    def __init__(self, bad_layer: int | None, kind: str = "log") -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(Block(kind if i == bad_layer else None) for i in range(3))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x.sum()


def _line(kind: str) -> int:
    lines, start = inspect.getsourcelines(_bad)
    return start + next(i for i, text in enumerate(lines) if f"BAD LINE {kind}" in text)


@pytest.mark.parametrize("layer", [0, 1, 2], ids=["first", "middle", "last"])
@pytest.mark.parametrize("kind", list(BAD_FUNCS))
def test_names_the_op_module_call_and_line(kind, layer):
    model, x = Net(layer, kind), torch.randn(2, 4)
    report = tl.find_nonfinite(model, x)
    assert report and report.found
    op = report.op
    assert op.func_name == BAD_FUNCS[kind]
    assert report.module_call == f"layers.{layer}:1"
    assert report.source.file == __file__ and report.source.line == _line(kind)
    assert report.source.function == "_bad"
    assert not report.stats.finite
    assert report.trace.labels[-1] == op.label  # the forward halted right there
    assert report.trace.halted
    for label, value in report.parent_values.items():
        assert torch.equal(value, report.trace[label].out)
        assert report.parents[label].finite  # the culprit made the first non-finite value
    text = str(report)
    assert op.label in text and f"layers.{layer}:1" in text and f":{_line(kind)} in _bad" in text
    on_trace = tl.find_nonfinite(tl.trace(model, x))  # the same answer from a full trace
    assert on_trace.op.label == op.label and on_trace.module_call == report.module_call
    assert on_trace.source is None  # that trace was captured without source=True


def test_parent_statistics():
    report = tl.find_nonfinite(lambda t: torch.log(t) * 2, torch.tensor([1.0, -2.0, 4.0]))
    assert report.op.label == "log_1"
    stats = report.parents["input_1"]
    assert (stats.min, stats.max, stats.mean) == (-2.0, 4.0, 1.0)
    assert (stats.nan, stats.posinf, stats.neginf) == (0, 0, 0)
    assert (report.stats.nan, report.stats.min, report.stats.max) == (
        1,
        0.0,
        pytest.approx(1.3863, 1e-4),
    )


def test_a_non_finite_input_is_flagged_as_the_parent():
    x = torch.tensor([[1.0, float("inf"), 0.0, 2.0]])
    report = tl.find_nonfinite(Net(None), x)
    assert report.op.label == "linear_1"
    assert report.parents["input_1"].posinf == 1 and not report.parents["input_1"].finite
    assert "already non-finite" in str(report)


def test_nothing_found_says_so():
    model, x = Net(None), torch.randn(2, 4)
    report = tl.find_nonfinite(model, x)
    n_ops = len(tl.trace(model, x))
    assert not report and report.op is None and report.checked == n_ops
    assert str(report) == f"no NaN or Inf: none in the {n_ops} op outputs checked"
    on_trace = tl.find_nonfinite(tl.trace(model, x))
    assert not on_trace and on_trace.checked == n_ops


def test_halting_leaves_buffers_and_rng_as_they_were():
    class Noisy(nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = nn.BatchNorm1d(4)

        def forward(self, x):
            return torch.log(self.bn(x) - 100 + torch.rand_like(x))

    model = Noisy().train()
    torch.manual_seed(3)
    report = tl.find_nonfinite(model, torch.randn(8, 4))
    assert report.op.func_name == "log"
    assert torch.equal(model.bn.running_mean, torch.zeros(4))
    assert int(model.bn.num_batches_tracked) == 0


def test_structure_only_trace_is_refused():
    trace = tl.trace(Net(None), torch.randn(2, 4), structure_only=True)
    with pytest.raises(InvalidArgumentError) as err:
        tl.find_nonfinite(trace)
    assert err.value.code == "no_values"


def test_inf_false_skips_masks_filled_with_minus_inf():
    def masked_attention(scores):
        mask = torch.ones(3, 3).triu(1).bool()
        scores = scores.masked_fill(mask, float("-inf"))  # -inf on purpose
        weights = torch.softmax(scores, dim=-1)
        return torch.sqrt(weights - 0.5)  # NaN where a weight is below 0.5

    scores = torch.zeros(3, 3)
    assert tl.find_nonfinite(masked_attention, scores).op.func_name == "masked_fill"
    report = tl.find_nonfinite(masked_attention, scores, inf=False)
    assert report.op.func_name == "sqrt" and report.parents["sub_1"].min == -0.5
    assert str(report).startswith("first output with a NaN: sqrt_1")
    assert tl.find_nonfinite(tl.trace(masked_attention, scores), inf=False).op.label == "sqrt_1"
    assert "no NaN:" in str(tl.find_nonfinite(torch.exp, torch.tensor([1000.0]), inf=False))


def test_a_finite_value_whose_sum_overflows_is_finite():
    from torchlens.debug.nonfinite import is_nonfinite

    big = torch.full((10,), 60000.0, dtype=torch.float16)
    assert not is_nonfinite(big) and is_nonfinite(torch.tensor([1.0, float("nan")]))
    assert not is_nonfinite(torch.tensor([1, 2])) and not is_nonfinite(torch.empty(0))
