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
from torchlens.capture.roots import method_owner

try:
    from tests._capture_agreement import assert_record_agrees
    from tests.realworld.cases import CASES, CASES_BY_NAME, FAMILIES, missing_packages
except ImportError:  # repository root not on sys.path (e.g. bare `pytest`)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from _capture_agreement import assert_record_agrees
    from cases import CASES, CASES_BY_NAME, FAMILIES, missing_packages

REQUIRED_TAGS = {
    "kwargs", "mask", "cache", "train", "checkpointing", "moe", "ssm", "detection",
    "generate", "inference_mode", "labels", "rooted", "offload",
}  # fmt: skip


@pytest.fixture
def one_thread():
    """Run on one intra-op thread: the models are tiny, and on a busy shared runner threads
    waiting for a core made single forwards 10-50x slower. Restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# Cases whose forward has a real dependency through a Python value (issue 50: the state is
# "incomplete", every recorded op and edge proven), with the escape's line and the
# functions of the ops it reaches. Keypoint R-CNN sizes each keypoint heat map with
# int(widths_ceil[i].item()) and divides by it (torchvision's heatmaps_to_keypoints); the
# probe that moves the value down (issue 50, item 4) crosses the integer and shows it.
HIDDEN_DEPENDENCIES = {
    "tv_keypointrcnn": ("via .item() at roi_heads.py:285", {"div", "interpolate"}),
}


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
    if case.name in HIDDEN_DEPENDENCIES:  # real dependencies through Python values
        line, children = HIDDEN_DEPENDENCIES[case.name]
        assert status.state == "incomplete", f"{case.name}:\n{status}"
        assert not status.failures and not status.unchecked
        assert status.hidden_edges, f"{case.name}:\n{status}"
        for edge in status.hidden_edges:
            assert str(edge).endswith(line) and edge.child.rstrip("_0123456789") in children
        return
    assert status.state == "passed", f"{case.name}:\n{status}"


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_record_labels_ops_as_trace_does(case, one_thread):
    """One capture path (issue 49): ``tl.record`` gives every op of a real model the
    label, index, function and module calls ``tl.trace`` gives it (``tl.extract`` and
    ``find_nonfinite`` count through ``tl.record``'s mode)."""
    if "transformers" in case.needs:
        pytest.importorskip("transformers")
    missing = missing_packages(case)
    if missing:
        pytest.skip(f"{case.name} needs {', '.join(missing)}")
    assert_record_agrees(case.build)


def _named_weights(model, trace) -> tuple[set[str], set[str]]:
    """The addresses of the modules ``model``'s capture can name (its root's, or the
    modules a function names in ``zoo_modules``) and the weights of those that ran, each
    tensor at its first address (tied weights once), as ``named_parameters()`` gives."""
    owner = method_owner(model)
    if isinstance(model, torch.nn.Module):
        tops = {"": model}
    elif owner is not None:
        tops = {"": owner}
    else:
        tops = dict(getattr(model, "zoo_modules", {}))
    ran = {m.address for m in trace.modules}
    addresses, weights, seen = set(), set(), set()
    for prefix, top in tops.items():
        for address, module in top.named_modules():
            full = ".".join(part for part in (prefix, address) if part)
            addresses.add(full)
            for name, param in module.named_parameters(recurse=False):
                if full in ran and id(param) not in seen:
                    weights.add(f"{full}.{name}" if full else name)
                seen.add(id(param))
    return addresses, weights


@pytest.mark.slow
@pytest.mark.parametrize(
    "case", [c for c in CASES if "rooted" in c.tags], ids=lambda case: case.name
)
def test_rooted_case_names_every_module_call_and_weight(case, one_thread):
    """Whatever the traced callable is (a bound method, a function over modules, an
    offloaded model), each module call is at an address of the module it ran, each weight
    read is a parameter source at its address (as many as the modules that ran hold), and
    the capture validates."""
    missing = missing_packages(case)
    if missing:
        pytest.skip(f"{case.name} needs {', '.join(missing)}")
    model, args, kwargs = case.build()
    torch.manual_seed(7)
    trace = tl.trace(model, args, kwargs)
    addresses, weights = _named_weights(model, trace)
    calls = [m for m in trace.modules if m.address]
    assert calls, case.name
    groups = {m.address for m in calls if m.module_type.islower()}  # opened functions (sdpa)
    # modules the root does not reach (the ``kernels`` package's Func wrappers of
    # apply_rotary_pos_emb) are at fallback addresses, below their class name
    fallbacks = set(trace.meta.get("fallback_modules", ()))
    for address in {m.address for m in calls} - groups - addresses:
        assert address.split(".")[0] in fallbacks, address
    assert {s.path for s in trace.sources if s.kind == "parameter"} == weights
    assert not [s for s in trace.sources if s.kind == "constant" and s.path in weights]
    model, args, kwargs = case.build()
    torch.manual_seed(7)
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
