"""CUDA: capture, RNG replay and validation on the GPU and across devices.

Every test here skips cleanly on a machine without CUDA (as CI's is).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.capture import rng

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


class MixedDevices(nn.Module):
    """Starts on the CPU, moves to the GPU inside forward, and comes back."""

    def __init__(self) -> None:
        super().__init__()
        self.cpu_part = nn.Linear(8, 8)
        self.gpu_part = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5)).cuda()

    def forward(self, x):
        h = self.cpu_part(x).relu()
        h = self.gpu_part(h.to("cuda"))
        return h.cpu() + torch.rand(8, device="cuda").cpu()


def test_mixed_cpu_cuda_model_captures_and_validates():
    torch.manual_seed(0)
    model = MixedDevices().train()
    x = torch.randn(4, 8)
    trace = tl.trace(model, x)
    devices = {op.label: op.device.type for op in trace}
    assert devices["linear_1"] == "cpu" and devices["to_1"] == "cuda"
    assert devices["linear_2"] == "cuda" and devices["cpu_1"] == "cpu"
    assert trace["dropout_1"].rng_state is not None
    assert any(key.startswith("cuda:") for key in trace["dropout_1"].rng_state)
    status = tl.replay(model, x)
    assert status.state == "passed", status


def test_cuda_rng_state_is_snapshotted_and_restored():
    torch.cuda.init()
    state = rng.snapshot()
    assert "cuda:0" in state
    first = torch.rand(3, device="cuda")
    rng.restore(state)
    assert torch.equal(torch.rand(3, device="cuda"), first)


def test_cuda_model_save_load_roundtrip(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.GELU()).cuda().eval()
    trace = tl.trace(model, torch.randn(2, 4, device="cuda"))
    trace.save(tmp_path / "t")
    loaded = tl.load(tmp_path / "t")
    for op in trace:
        assert torch.equal(loaded[op.label].out.cpu(), op.out.cpu())


def test_half_precision_on_cuda_validates():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.LayerNorm(16), nn.GELU()).cuda().half().eval()
    x = torch.randn(4, 16, device="cuda", dtype=torch.float16)
    assert tl.validate(model, x)
