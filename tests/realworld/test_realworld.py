"""The real-model zoo: every architecture in ``cases.py`` must validate ``passed``.

Marked ``slow``: the default test run deselects it. Run it in an environment with a
``torch`` / ``torchvision`` pair that loads together (see the ``zoo`` extra)::

    python -m pytest tests/realworld -m slow

Cases whose packages cannot be imported skip with the import error as the reason (PyPI's
``torchvision`` does not load its compiled ops against the CPU ``torch`` wheel, and ``timm``
imports ``torchvision``). The coverage test below is not slow and needs no extra package.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import torchlens as tl

try:
    from tests.realworld.cases import CASES, CASES_BY_NAME, FAMILIES, missing_packages
except ImportError:  # repository root not on sys.path (e.g. bare `pytest`)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from cases import CASES, CASES_BY_NAME, FAMILIES, missing_packages

REQUIRED_TAGS = {
    "kwargs", "mask", "cache", "train", "checkpointing", "moe", "ssm", "detection",
    "generate", "inference_mode", "labels",
}  # fmt: skip


@pytest.fixture
def one_thread():
    """Run on one intra-op thread: the models are tiny, and on a busy shared runner threads
    waiting for a core made single forwards 10-50x slower. Restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_real_model_validates(case, one_thread):
    if "transformers" in case.needs:
        pytest.importorskip("transformers")
    missing = missing_packages(case)
    if missing:
        pytest.skip(f"{case.name} needs {', '.join(missing)}")
    model, args, kwargs = case.build()
    status = tl.replay(model, args, kwargs)
    assert status.state == "passed", f"{case.name}:\n{status}"


def test_zoo_covers_the_families_and_situations():
    assert len(CASES) >= 40
    assert len(CASES_BY_NAME) == len(CASES), "case names must be unique"
    assert {case.family for case in CASES} == set(FAMILIES)
    assert REQUIRED_TAGS <= set().union(*(case.tags for case in CASES))
    for case in CASES:
        assert case.needs, f"{case.name} names no package"
        assert case.family in FAMILIES, case.name
