"""The model sweep's conversions and check modes (``benchmarks/sweep_models.py --dtype``,
``--channels-last``, ``--grad``, ``--autocast``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

try:
    from tests._benchmarks import load_benchmark
except ImportError:  # repository root not on sys.path (e.g. bare `pytest`)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _benchmarks import load_benchmark

sweep = load_benchmark("sweep_models")


def _build():
    torch.manual_seed(0)
    image = torch.randn(2, 3, 8, 8)
    ids = torch.arange(6).reshape(2, 3)
    return nn.Conv2d(3, 4, 3), (image,), {"extra": [torch.randn(2, 3)], "ids": ids}


def test_dtype_casts_the_model_and_floating_inputs_only():
    model, args, kwargs = sweep.converted(_build, torch.bfloat16, channels_last=False)
    assert model.weight.dtype == torch.bfloat16
    assert args[0].dtype == torch.bfloat16
    assert kwargs["extra"][0].dtype == torch.bfloat16 and isinstance(kwargs["extra"], list)
    assert kwargs["ids"].dtype == torch.int64  # token ids stay integers
    assert torch.equal(args[0].float(), _build()[1][0].bfloat16().float())


def test_channels_last_converts_the_model_and_image_inputs():
    model, args, kwargs = sweep.converted(_build, None, channels_last=True)
    assert model.weight.is_contiguous(memory_format=torch.channels_last)
    assert not model.weight.is_contiguous()
    assert args[0].is_contiguous(memory_format=torch.channels_last)
    assert not args[0].is_contiguous()
    assert kwargs["extra"][0].is_contiguous()  # not 4-d: left as it was
    assert torch.equal(args[0], _build()[1][0])


def test_channels_last_takes_the_3d_format_for_5d_weights_and_clips():
    def build():
        model = nn.Sequential(nn.Conv3d(3, 4, 3), nn.Flatten(0, 1), nn.Conv2d(2, 2, 3))
        return model, (torch.randn(1, 3, 4, 6, 6),), {}

    model, args, _ = sweep.converted(build, None, channels_last=True)
    assert model[0].weight.is_contiguous(memory_format=torch.channels_last_3d)
    assert model[2].weight.is_contiguous(memory_format=torch.channels_last)
    assert not model[2].weight.is_contiguous()
    assert args[0].is_contiguous(memory_format=torch.channels_last_3d)
    assert not args[0].is_contiguous()
    assert isinstance(model[0].weight, nn.Parameter)


def test_a_bad_dtype_is_refused(capsys):
    with pytest.raises(SystemExit) as stop:
        sweep.main(["--dtype", "not_a_dtype"])
    assert stop.value.code == 2
    assert "is not a torch dtype" in capsys.readouterr().err


class _SeesGradMode(nn.Module):
    """Notes the grad mode of each call it gets, and computes a little."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 2)
        self.seen: list[tuple[bool, bool, bool]] = []

    def forward(self, x):
        modes = torch.is_grad_enabled(), torch.is_inference_mode_enabled()
        self.seen.append((*modes, torch.is_autocast_enabled("cpu")))
        return self.linear(x).relu()


def test_the_check_runs_in_the_grad_mode_and_autocast_asked_for():
    for grad, autocast, expected in [
        ("enabled", None, (True, False, False)),
        ("no_grad", None, (False, False, False)),
        ("inference", None, (False, True, False)),
        ("no_grad", torch.bfloat16, (False, False, True)),
    ]:
        model = _SeesGradMode()

        def build(model=model):
            return model, (torch.randn(4, 3),), {}

        record = sweep.sweep_one(build, "sees", sweep.check_context(grad, autocast))
        assert record["state"] == "passed", record
        # the plain forward deciding the skip, the rerun and the capture: all in the modes
        assert len(model.seen) >= 3 and set(model.seen) == {expected}, (grad, model.seen)


def test_an_unknown_grad_mode_or_autocast_dtype_is_refused(capsys):
    for argv, message in [
        (["--grad", "sometimes"], "invalid choice"),
        (["--autocast", "half_and_half"], "is not a torch dtype"),
    ]:
        with pytest.raises(SystemExit) as stop:
            sweep.main(argv)
        assert stop.value.code == 2
        assert message in capsys.readouterr().err


class _FailsUnderAutocast(nn.Linear):
    def forward(self, x):
        if torch.is_autocast_enabled("cpu"):
            raise RuntimeError("value cannot be converted without overflow")
        return super().forward(x)


def test_a_model_whose_plain_forward_fails_in_the_check_modes_is_skipped():
    def build():
        return _FailsUnderAutocast(3, 2), (torch.randn(4, 3),), {}

    record = sweep.sweep_one(build, "fails", sweep.check_context("no_grad", torch.bfloat16))
    assert "state" not in record
    assert record["skip"].startswith("build or forward: RuntimeError: value cannot be")
    assert sweep.sweep_one(build, "fails", sweep.check_context())["state"] == "passed"
