"""Sanity tests for the model zoo in tests/models.py (not for torchlens itself)."""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import pytest
import torch

try:
    from tests.models import ZOO, ZOO_BY_NAME, ZooCase, zoo_params
except ImportError:  # repository root not on sys.path (e.g. bare `pytest`)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from models import ZOO, ZOO_BY_NAME, ZooCase, zoo_params

REQUIRED_TAGS = {
    "buffers_update",
    "stochastic",
    "inplace",
    "views",
    "indexing",
    "multi_output",
    "rnn",
    "attention",
    "containers",
    "kwargs",
    "int",
    "complex",
    "created",
    "function",
    "half",
}


def _leaves(obj, path="out"):
    """Flatten nested outputs/inputs into ``(path, leaf)`` pairs."""
    if isinstance(obj, torch.Tensor):
        return [(path, obj)]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        pairs = [(path, type(obj))]
        for f in dataclasses.fields(obj):
            pairs += _leaves(getattr(obj, f.name), f"{path}.{f.name}")
        return pairs
    if isinstance(obj, dict):
        pairs = [(path, ("dict", tuple(obj)))]
        for k, v in obj.items():
            pairs += _leaves(v, f"{path}[{k!r}]")
        return pairs
    if isinstance(obj, (list, tuple)):
        pairs = [(path, (type(obj), len(obj)))]
        for i, v in enumerate(obj):
            pairs += _leaves(v, f"{path}[{i}]")
        return pairs
    return [(path, obj)]


def _assert_same(a, b):
    la, lb = _leaves(a), _leaves(b)
    assert [p for p, _ in la] == [p for p, _ in lb]
    for (path, x), (_, y) in zip(la, lb):
        if isinstance(x, torch.Tensor):
            assert isinstance(y, torch.Tensor), path
            torch.testing.assert_close(x, y, rtol=0, atol=0, equal_nan=True, msg=path)
        else:
            assert x == y, path


def _state(model):
    """Snapshot of the model's tensors (state_dict or partial's tensor keywords)."""
    if isinstance(model, torch.nn.Module):
        return {k: v.detach().clone() for k, v in model.state_dict().items()}
    keywords = getattr(model, "keywords", {})
    return {k: v.clone() for k, v in keywords.items() if isinstance(v, torch.Tensor)}


def _run(case: ZooCase, model, seed: int = 0):
    args, kwargs = case.make_inputs()
    torch.manual_seed(seed)
    return model(*args, **kwargs)


def test_zoo_size_and_names():
    names = [case.name for case in ZOO]
    assert len(ZOO) >= 70
    assert len(set(names)) == len(names)
    assert set(ZOO_BY_NAME) == set(names)
    for name in names:
        assert re.fullmatch(r"[a-z][a-z0-9]*(_[a-z0-9]+)*", name), name


def test_required_tags_used():
    used = set().union(*(case.tags for case in ZOO))
    assert REQUIRED_TAGS <= used, REQUIRED_TAGS - used
    assert len([c for c in ZOO if "function" in c.tags]) >= 3
    for case in ZOO:
        assert isinstance(case.tags, frozenset)
        assert not (case.train and "function" in case.tags)


def test_zoo_params_filters_by_tag():
    params = zoo_params("rnn")
    assert params and all("rnn" in p.values[0].tags for p in params)
    assert [p.id for p in zoo_params()] == [c.name for c in ZOO]


@pytest.mark.parametrize("case", zoo_params())
def test_case_builds_and_is_deterministic(case: ZooCase):
    model = case.make_model()
    if "function" in case.tags:
        assert callable(model) and not isinstance(model, torch.nn.Module)
    else:
        assert isinstance(model, torch.nn.Module)
        assert all(m.training == case.train for m in model.modules())

    # Factories are deterministic.
    _assert_same(_state(model), _state(case.make_model()))
    args, kwargs = case.make_inputs()
    assert isinstance(args, tuple) and isinstance(kwargs, dict)
    _assert_same((args, kwargs), case.make_inputs())

    state_before = _state(model)
    args_copy = _leaves((args, kwargs))
    args_copy = [(p, x.clone() if isinstance(x, torch.Tensor) else x) for p, x in args_copy]
    torch.manual_seed(0)
    out1 = model(*args, **kwargs)
    out2 = _run(case, model)
    _assert_same(out1, out2)

    # Inputs are only modified by cases that say so.
    after = _leaves((args, kwargs))
    inputs_changed = any(
        isinstance(x, torch.Tensor) and not torch.equal(x, y)
        for (_, x), (_, y) in zip(args_copy, after)
    )
    assert inputs_changed == ("mutates_input" in case.tags)

    # Parameters never change; buffers change exactly for "buffers_update" cases.
    state_after = _state(model)
    assert state_after.keys() == state_before.keys()
    changed = {k for k in state_before if not torch.equal(state_before[k], state_after[k])}
    if "buffers_update" in case.tags:
        assert changed
        params = dict(model.named_parameters())
        assert not changed & params.keys()
    else:
        assert not changed, changed


@pytest.mark.parametrize("case", zoo_params("stochastic"))
def test_stochastic_cases_depend_on_seed(case: ZooCase):
    model = case.make_model()
    out0, out1 = _run(case, model, seed=0), _run(case, model, seed=1)
    t0 = [x for _, x in _leaves(out0) if isinstance(x, torch.Tensor)]
    t1 = [x for _, x in _leaves(out1) if isinstance(x, torch.Tensor)]
    assert any(not torch.equal(a, b) for a, b in zip(t0, t1))


@pytest.mark.parametrize("case", zoo_params())
def test_case_backward_runs(case: ZooCase):
    model = case.make_model()
    out = _run(case, model)
    diff = [
        x
        for _, x in _leaves(out)
        if isinstance(x, torch.Tensor) and x.requires_grad and x.numel() > 0
    ]
    assert diff, "every zoo case should have a differentiable output"
    loss = sum((x.abs() if x.is_complex() else x).float().sum() for x in diff)  # complex -> real
    loss.backward()
    if isinstance(model, torch.nn.Module) and any(True for _ in model.parameters()):
        assert any(p.grad is not None for p in model.parameters())
