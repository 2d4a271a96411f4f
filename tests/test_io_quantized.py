"""Quantized values (torch.ao int8 models) survive saving: integer data and qparams alike."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.errors import PayloadUnavailableError, TraceFileError
from torchlens.io._payloads import stored_form

pytestmark = pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor:UserWarning")


class _Quantized(nn.Module):
    """One value of each qscheme, and a torch.ao quantized layer."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.ao.nn.quantized.Linear(4, 3)

    def forward(self, x):
        per_tensor = torch.quantize_per_tensor(x, 0.05, 3, torch.quint8)
        scales, zeros = torch.tensor([0.1, 0.2]), torch.tensor([1, 2])
        per_channel = torch.quantize_per_channel(x, scales, zeros, 0, torch.qint8)
        float_zeros = torch.quantize_per_channel(x, scales, zeros.float() + 0.5, 0, torch.quint8)
        hidden = self.linear(torch.nn.functional.relu(per_tensor))
        return hidden.dequantize().sum() + per_channel.dequantize() + float_zeros.dequantize()


def _quantized_values(trace) -> dict[str, torch.Tensor]:
    return {
        r.label: r.out for r in [*trace.sources, *trace.ops] if r.has_out and r.out.is_quantized
    }


def _assert_same_quantized(a: torch.Tensor, b: torch.Tensor, label: str) -> None:
    assert (a.dtype, a.shape, a.qscheme()) == (b.dtype, b.shape, b.qscheme()), label
    assert torch.equal(a.int_repr(), b.int_repr()), label
    if a.qscheme() == torch.per_tensor_affine:
        assert (a.q_scale(), a.q_zero_point()) == (b.q_scale(), b.q_zero_point()), label
    else:
        assert a.q_per_channel_axis() == b.q_per_channel_axis(), label
        assert torch.equal(a.q_per_channel_scales(), b.q_per_channel_scales()), label
        assert torch.equal(a.q_per_channel_zero_points(), b.q_per_channel_zero_points()), label
    assert torch.equal(a.dequantize(), b.dequantize()), label


@pytest.mark.parametrize("streamed", [False, True])
def test_quantized_values_round_trip(tmp_path, streamed):
    model, x = _Quantized(), torch.randn(2, 4)
    if streamed:
        trace = tl.trace(model, x, stream_to=tmp_path / "t")
        original = _quantized_values(tl.trace(model, x))
    else:
        trace = tl.trace(model, x)
        original = _quantized_values(trace)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # nothing to warn about: every value is kept
            tl.save(trace, tmp_path / "t")
    qschemes = {value.qscheme() for value in original.values()}
    assert qschemes >= {
        torch.per_tensor_affine, torch.per_channel_affine, torch.per_channel_affine_float_qparams
    }  # fmt: skip
    loaded = tl.load(tmp_path / "t")
    assert _quantized_values(loaded).keys() == original.keys()
    for label, value in original.items():
        _assert_same_quantized(loaded[label].out, value, label)
    torch.testing.assert_close(loaded.output, model(x))
    assert " 0 without values " in tl.diff(trace, loaded).headline()


def test_bad_quantization_parameters_are_a_corrupt_payload(tmp_path):
    root = tl.save(tl.trace(_Quantized(), torch.randn(2, 4)), tmp_path / "t")
    manifest = json.loads((root / "manifest.json").read_text())
    label = next(k for k, e in manifest["payloads"].items() if "quantized" in e)
    manifest["payloads"][label]["quantized"]["qscheme"] = "per_nothing"
    (root / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(TraceFileError) as err:
        tl.load(root)[label].out
    assert err.value.code == "corrupt_payload" and "quantization parameters" in str(err.value)


def test_values_without_a_stored_form_say_what_they_are(tmp_path):
    def forward(x):
        return x.to_sparse().to_dense()

    loaded = tl.load(tl.save(tl.trace(forward, torch.randn(2, 4)), tmp_path / "t"))
    with pytest.raises(PayloadUnavailableError) as err:
        loaded["to_sparse_1"].out
    assert err.value.code == "not_saved"
    assert "torch.sparse_coo (sparse or blocked) tensors cannot be stored" in str(err.value)
    x = torch.randn(2, 4)
    unstorable = {
        "torch.quint4x2 quantized": torch.quantize_per_tensor(x, 0.1, 2, torch.quint4x2),
        "nested": torch.nested.nested_tensor([x[0], x[1, :2]], layout=torch.jagged),
    }
    for kind, value in unstorable.items():
        with pytest.raises(ValueError, match=f"^{kind} tensors cannot be stored"):
            stored_form(value)
