"""The byte-golden smoke test: a fresh save of the tiny golden model equals the committed one.

Runs only on torch 2.13.0 (the release the golden was written with; CI pins it). The two
version strings in the manifest are compared as release numbers, because wheels of one
release differ in their local tag (``2.13.0+cpu``, ``2.13.0+cu128``); every other byte must
match. If the format changes on purpose, rerun ``python tests/golden/make_golden.py``.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
import torch

import torchlens as tl

_HERE = Path(__file__).resolve().parent / "golden"
_spec = importlib.util.spec_from_file_location("make_golden", _HERE / "make_golden.py")
make_golden = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_golden)

pytestmark = pytest.mark.skipif(
    not torch.__version__.startswith(make_golden.TORCH_VERSION),
    reason=f"the byte-golden trace pins torch {make_golden.TORCH_VERSION}; "
    f"this is torch {torch.__version__}",
)
_VERSION_LINE = re.compile(r'^(\s*"(?:torch|torchlens)_version": ")([^"+]*)(?:\+[^"]*)?(",?)$')


def _normalized(manifest: bytes) -> list[str]:
    lines = manifest.decode("ascii").splitlines()
    return [_VERSION_LINE.sub(r"\1\2\3", line) for line in lines]


def test_fresh_save_matches_the_golden_bytes(tmp_path):
    fresh = make_golden.write(tmp_path / "t")
    golden = make_golden.GOLDEN
    names = sorted(p.name for p in golden.iterdir())
    assert sorted(p.name for p in fresh.iterdir()) == names
    hint = "rerun `python tests/golden/make_golden.py` if the format changed on purpose"
    for name in names:
        got, want = (fresh / name).read_bytes(), (golden / name).read_bytes()
        if name == "manifest.json":
            assert _normalized(got) == _normalized(want), hint
            continue
        assert got == want, f"{name} differs from the golden; {hint}"


def test_golden_loads_and_replays():
    from torchlens.replay import check_trace

    loaded = tl.load(make_golden.GOLDEN)
    assert loaded.labels == ["linear_1", "relu_1", "t_1", "mul_1", "add_1", "gt_1", "to_1"]
    assert loaded["to_1"].out.dtype == torch.bfloat16
    assert loaded["gt_1"].out.dtype == torch.bool
    assert check_trace(loaded).state == "passed"
    manifest = json.loads((make_golden.GOLDEN / "manifest.json").read_text())
    assert manifest["format_version"] == 1
