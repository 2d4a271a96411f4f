"""Saved traces follow the user's umask: payload files get the same mode as the manifest."""

from __future__ import annotations

import os
import stat

import pytest
import torch
from torch import nn

import torchlens as tl

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")


@pytest.fixture(params=[0o022, 0o002, 0o027], ids=oct)
def umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def _modes(root):
    return {
        str(path.relative_to(root)): stat.S_IMODE(path.stat().st_mode)
        for path in root.rglob("*")
        if path.is_file()
    }


def test_saved_files_follow_the_umask(umask, tmp_path):
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    trace = tl.trace(model, torch.randn(2, 4), save_grads=True)
    trace.backward()
    modes = _modes(trace.save(tmp_path / "run"))
    assert {"manifest.json", "payloads.safetensors", "rng.safetensors"} <= set(modes)
    assert "grads.safetensors" in modes
    assert set(modes.values()) == {0o666 & ~umask}, modes


def test_streamed_files_follow_the_umask(umask, tmp_path):
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    tl.trace(model, torch.randn(2, 4), stream_to=tmp_path / "run")
    modes = _modes(tmp_path / "run")
    assert any(name.startswith("payloads") and "/" in name for name in modes)
    assert set(modes.values()) == {0o666 & ~umask}, modes
