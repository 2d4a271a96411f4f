"""The model sweep's conversions (``benchmarks/sweep_models.py --dtype/--channels-last``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch
from torch import nn

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "sweep_models.py"


def _sweep_module():
    spec = importlib.util.spec_from_file_location("sweep_models_under_test", _PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


sweep = _sweep_module()


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
    try:
        sweep.main(["--dtype", "not_a_dtype"])
    except SystemExit as stop:
        assert stop.code == 2
    else:
        raise AssertionError("main accepted an unknown dtype")
    assert "is not a torch dtype" in capsys.readouterr().err
