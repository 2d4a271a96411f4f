"""tl.diff: matching two runs op by op and naming where they diverge."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.cli import main
from torchlens.errors import MissingDependencyError
from torchlens.replay.tolerances import tolerance

try:
    from tests.models import ZOO_BY_NAME
except ImportError:  # repository root not on sys.path (e.g. bare `pytest`)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from models import ZOO_BY_NAME

TRANSFORMER = ZOO_BY_NAME["transformer_encoder_layer"]


def _transformer_trace(dtype: torch.dtype = torch.float32, edit=None) -> tl.Trace:
    model = TRANSFORMER.make_model().to(dtype)
    if edit is not None:
        edit(model)
    (x,), _ = TRANSFORMER.make_inputs()
    return tl.trace(model, x.to(dtype))


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)).eval()


def test_identical_runs_have_no_divergence():
    a, b = _transformer_trace(), _transformer_trace()
    result = tl.diff(a, b)
    assert result.first_divergence is None and result.same
    assert len(result.rows) == len(a) and not result.only_in_a and not result.only_in_b
    assert {row.status for row in result.rows} == {"same"}
    assert max(row.max_abs for row in result.rows) == 0.0
    assert "no divergence" in str(result)


def test_bf16_vs_fp32_reads_as_smooth_growth_of_the_norm_relative_error():
    a, b = _transformer_trace(), _transformer_trace(torch.bfloat16)
    result = tl.diff(a, b)
    rtol, atol = tolerance(torch.bfloat16)
    elementwise = 0  # what an elementwise isclose at bf16's tolerance would flag
    for row in result.rows:
        x, y = a[row.label_a].out.double(), b[row.label_b].out.double()
        assert row.rel_error == pytest.approx(((x - y).norm() / x.norm()).item())
        assert row.cosine == pytest.approx(
            torch.cosine_similarity(x.flatten(), y.flatten(), 0).item()
        )
        assert 0 < row.rel_error < 0.02 and row.cosine > 0.9995
        assert row.status == (
            "differs" if row.rel_error > rtol + atol / x.pow(2).mean().sqrt() else "same"
        )
        elementwise += not torch.isclose(x, y, rtol=rtol, atol=atol).all()
    assert elementwise > len(result.rows) // 2  # near-zero elements: "most ops differ"
    assert result.first_divergence is None and not result.diverged
    assert result.rows[0].dtype_a == "float32" and result.rows[0].dtype_b == "bfloat16"
    head = result.headline()
    assert "0 differ (||a - b|| / ||a|| beyond tolerance)" in head
    assert "relative error ||a - b|| / ||a||: " in head and "median" in head


def test_bf16_vs_fp32_names_the_first_op_beyond_tolerance_by_norm():
    def bump(model):
        with torch.no_grad():
            model.layer.linear2.weight.mul_(1.1)

    a, b = _transformer_trace(), _transformer_trace(torch.bfloat16, edit=bump)
    result = tl.diff(a, b)
    rtol, atol = tolerance(torch.bfloat16)
    first = None  # worked out independently: rms(a - b) > atol + rtol * rms(a)
    for op in a:
        x, y = op.out.double(), b[op.label].out.double()
        if (x - y).pow(2).mean().sqrt() > atol + rtol * x.pow(2).mean().sqrt():
            first = op.label
            break
    reader = next(op for op in a if "layer.linear2.weight" in op.parents)
    assert first == reader.label == result.first_divergence.label_a
    assert result.first_divergence.rel_error > 0.05
    assert "relative error" in result.headline() and "cosine" in result.headline()


def test_an_upcast_of_a_bf16_value_is_judged_at_bf16_tolerance():
    def fn(x):
        return (x * 3).float().exp()

    x = torch.randn(50)
    result = tl.diff(tl.trace(fn, x), tl.trace(fn, x.bfloat16()))
    assert result["exp_1"].dtype_a == result["exp_1"].dtype_b == "float32"
    assert result["exp_1"].rel_error > 1e-4 and result["exp_1"].status == "same"
    assert result.same
    wrong = tl.diff(tl.trace(fn, x), tl.trace(fn, (x * 1.1).bfloat16()))
    assert wrong.first_divergence.label_a == "mul_1" and not wrong.same


def test_changed_weight_names_the_op_that_reads_it():
    def bump(model):
        with torch.no_grad():
            model.layer.linear1.weight[0, 0] += 1.0

    a, b = _transformer_trace(), _transformer_trace(edit=bump)
    result = tl.diff(a, b)
    reader = next(op for op in a if "layer.linear1.weight" in op.parents)
    first = result.first_divergence
    assert first.label_a == reader.label and first.module_call == "layer.linear1:1"
    index = [r.label_a for r in result.rows].index(first.label_a)
    assert all(r.max_abs == 0.0 for r in result.rows[:index])
    assert first.max_abs == pytest.approx(
        (a[reader.label].out - b[reader.label].out).abs().max().item()
    )


def test_perturbed_input_diverges_at_the_first_op_and_tolerances_are_overridable():
    model, x = _mlp(), torch.randn(2, 4)
    a, b = tl.trace(model, x), tl.trace(model, x + 1e-4)
    assert tl.diff(a, b).first_divergence.label_a == "linear_1"
    loose = tl.diff(a, b, atol=1e-2, rtol=0.0)
    assert loose.first_divergence is None and loose.same
    assert loose["linear_1"].max_abs > 0


def test_ops_only_in_one_run_and_matching_by_position():
    def run_a(x):
        return torch.sin(x).relu() * 2

    def run_b(x):
        return torch.cos(x).relu() * 2

    x = torch.randn(5)
    result = tl.diff(tl.trace(run_a, x), tl.trace(run_b, x))
    assert result.only_in_a == ["sin_1"] and result.only_in_b == ["cos_1"]
    assert [(r.label_a, r.matched_by) for r in result.rows] == [
        ("relu_1", "label"),
        ("mul_1", "label"),
    ]
    assert result.first_divergence.label_a == "relu_1" and not result.same

    def extra(x):
        return torch.sin(torch.sin(x)) + 1

    def once(x):
        return torch.sin(x) + 1

    shifted = tl.diff(tl.trace(extra, x), tl.trace(once, x))
    assert ("sin_1", "sin_1", "label") in [
        (r.label_a, r.label_b, r.matched_by) for r in shifted.rows
    ]
    assert shifted.only_in_a == ["sin_2"] and shifted.only_in_b == []


def test_relabelled_ops_match_by_graph_position():
    x = torch.randn(3)

    def extra_first(t):
        noise = torch.sin(t * 0)  # one more sin first: every later sin label shifts by one
        return torch.sin(torch.cos(t)) + noise

    def plain(t):
        return torch.sin(torch.cos(t)) + 0

    result = tl.diff(tl.trace(extra_first, x), tl.trace(plain, x))
    pairs = {(r.label_a, r.label_b, r.matched_by) for r in result.rows}
    assert ("sin_2", "sin_1", "position") in pairs and ("cos_1", "cos_1", "label") in pairs
    assert result["sin_2"].status == "same" and result["sin_2"].max_abs == 0.0
    assert result.only_in_a == ["mul_1", "sin_1"]


def test_shape_change_is_a_divergence():
    x = torch.randn(2, 4)
    result = tl.diff(tl.trace(lambda t: t.sum(0), x), tl.trace(lambda t: t.sum(1), x))
    assert result.first_divergence.status == "shape"
    assert "shape (4,) vs (2,)" in result.headline()


def test_saved_directories_and_cli(tmp_path, capsys):
    model, x = _mlp(), torch.randn(2, 4)
    tl.trace(model, x).save(tmp_path / "a")
    tl.trace(model, x).save(tmp_path / "same")
    tl.trace(model, x * 2).save(tmp_path / "b")
    assert tl.diff(tmp_path / "a", str(tmp_path / "same")).same
    assert tl.diff(tmp_path / "a", tmp_path / "b").first_divergence.label_a == "linear_1"
    assert main(["diff", str(tmp_path / "a"), str(tmp_path / "same")]) == 0
    assert "no divergence" in capsys.readouterr().out
    assert main(["diff", str(tmp_path / "a"), str(tmp_path / "b"), "--diverged"]) == 1
    out = capsys.readouterr().out
    assert "first divergence: linear_1 (linear) in 0:1" in out and "relu_1" in out
    assert main(["diff", str(tmp_path / "a"), str(tmp_path / "nowhere")]) == 2


def test_values_not_kept_are_unverified_not_same():
    model, x = _mlp(), torch.randn(2, 4)
    a = tl.trace(model, x, structure_only=True)
    result = tl.diff(a, tl.trace(model, x))
    assert {r.status for r in result.rows} == {"no value"}
    assert result.first_divergence is None and not result.same
    assert len(result.unverified) == 3


def test_nan_in_the_same_place_matches(monkeypatch):
    x = torch.tensor([1.0, -1.0])
    result = tl.diff(tl.trace(torch.log, x), tl.trace(torch.log, x.clone()))
    assert result.same
    other = tl.diff(tl.trace(torch.log, x), tl.trace(torch.log, torch.tensor([1.0, 2.0])))
    assert other.first_divergence.max_abs == float("inf")


def test_an_infinity_against_a_finite_value_has_an_infinite_relative_difference():
    a, b = torch.tensor([1.0, float("inf")]), torch.tensor([1.0, 2.0])
    first = tl.diff(tl.trace(torch.neg, a), tl.trace(torch.neg, b)).first_divergence
    assert first.max_abs == float("inf") and first.max_rel == float("inf")


def test_uninitialized_memory_is_not_compared_only_its_shape():
    # an MoE layer's buffer: torch.empty_like, then written; two runs hold other garbage
    def forward(x):
        buf = torch.empty_like(x)
        grown = x.new(3, 5)
        buf.zero_()
        return buf + x, grown.shape

    x = torch.randn(3, 5)
    a = tl.trace(forward, x)
    a["empty_like_1"].out.fill_(7.0)  # what another run's garbage looks like
    a["new_1"].out.fill_(float("nan"))
    result = tl.diff(a, tl.trace(forward, x))
    assert result.same and result.first_divergence is None
    assert result["empty_like_1"].status == result["new_1"].status == "uninitialized"
    assert result["add_1"].status == "same"
    grown = tl.diff(a, tl.trace(lambda x: forward(x[:2]), x))  # shapes still count
    assert grown.first_divergence.label_a == "empty_like_1"


def test_an_extra_constant_early_in_one_run_leaves_later_constants_paired():
    class ScalesOnFirstCall(nn.Module):  # as torchvision's MultiScaleRoIAlign
        scale = None

        def forward(self, x):
            if self.scale is None:
                self.scale = float(torch.tensor(0.5).log2())
            return x * torch.tensor(2.0) + torch.tensor(3.0)

    model, x = ScalesOnFirstCall(), torch.randn(3)
    first, later = tl.trace(model, x), tl.trace(model, x)
    result = tl.diff(first, later)
    assert result.only_in_a == ["tensor_1", "log2_1"] and not result.only_in_b
    assert not result.diverged
    assert [(r.label_a, r.label_b) for r in result.rows if r.func_name == "tensor"] == [
        ("tensor_2", "tensor_1"),
        ("tensor_3", "tensor_2"),
    ]


def test_ops_made_from_first_call_only_ops_do_not_take_the_later_labels():
    class IndexOnFirstCall(nn.Module):  # as BEiT's relative position index
        index = None

        def forward(self, x):
            if self.index is None:
                grid = torch.stack(torch.meshgrid(torch.arange(3), torch.arange(3), indexing="ij"))
                self.index = grid.permute(1, 2, 0).contiguous().sum(-1)
            return (x.permute(1, 0).contiguous() * 2).sum(0)

    model, x = IndexOnFirstCall(), torch.randn(4, 5)
    result = tl.diff(tl.trace(model, x), tl.trace(model, x))
    assert not result.diverged and not result.only_in_b
    assert result.only_in_a[-3:] == ["permute_1", "contiguous_1", "sum_1"]
    assert [(r.label_a, r.label_b) for r in result.rows] == [
        ("permute_2", "permute_1"),
        ("contiguous_2", "contiguous_1"),
        ("mul_1", "mul_1"),
        ("sum_2", "sum_1"),
    ]


def test_to_pandas_needs_pandas(monkeypatch):
    x = torch.randn(3)
    result = tl.diff(tl.trace(torch.sin, x), tl.trace(torch.sin, x))
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(MissingDependencyError) as err:
        result.to_pandas()
    assert err.value.code == "pandas_missing"
    assert result.to_dicts()[0]["label_a"] == "sin_1"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cpu_vs_cuda_compares_every_op():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))
    x = torch.randn(2, 3, 8, 8)
    cpu = tl.trace(model, x)
    cuda = tl.trace(model.cuda(), x.cuda())
    result = tl.diff(cpu, cuda, atol=1e-4, rtol=1e-4)
    assert not result.unverified and not result.only_in_a and not result.only_in_b
    assert {r.label_a for r in result.rows} == set(cpu.labels)
    assert result.same, result.headline()
    assert cuda["linear_1"].device.type == "cuda"
