"""The "Can and cannot" table is true: every supported row works through its public entry
point, and every unsupported row refuses with its code.

The table is walked, not copied: adding a row without a check here fails
``test_every_supported_row_has_a_check``.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.backends import TORCH_CAPABILITIES, get_backend_spec, require_capability
from torchlens.errors import CapabilityUnsupportedError, PayloadUnavailableError

CHECKS: dict[str, Callable[..., None]] = {}


def check(name: str):
    """Register the check of the supported capability ``name``."""

    def register(fn):
        CHECKS[name] = fn
        return fn

    return register


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)).eval()


def _x() -> torch.Tensor:
    return torch.randn(2, 4, generator=torch.Generator().manual_seed(1))


@check("backward_capture")
def _backward_capture(tmp_path):
    model, x = _mlp(), _x()
    trace = tl.trace(model, x, save_grads=True)
    trace.backward()
    # Independent arm: the same forward by hand, gradients from torch.autograd.grad.
    h = model[0](x)
    r = model[1](h)
    y = model[2](r)
    grads = torch.autograd.grad(y.sum(), [h, r, y])
    for label, want in zip(["linear_1", "relu_1", "linear_2"], grads):
        torch.testing.assert_close(trace[label].grad, want)


@check("fastlog")
def _fastlog(tmp_path):
    model, x = _mlp(), _x()
    recording = tl.record(model, x, save=tl.func("relu"))
    full = tl.trace(model, x)
    assert [view.label for view in recording] == ["relu_1"]
    assert torch.equal(recording["relu_1"].out, full["relu_1"].out)


@check("can_intervene")
def _can_intervene(tmp_path):
    model, x = _mlp(), _x()
    edited = tl.trace(model, x, intervene={tl.label("relu_1"): lambda t, op: torch.zeros_like(t)})
    torch.testing.assert_close(edited.output, model[2].bias.expand(2, 2))
    halted = tl.trace(model, x, stop_after=tl.func("relu"))
    assert halted.labels == ["linear_1", "relu_1"] and halted.output is None


@check("rng_replay")
def _rng_replay(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5)).train()
    x = _x()
    assert tl.validate(model, x)
    protocol = get_backend_spec("torch").protocol()
    torch.manual_seed(5)
    reference = protocol.reference_output(model, x, None)
    torch.manual_seed(5)
    captured = protocol.capture(model, x, None)
    status = protocol.validate(captured, reference)
    assert status.state == "passed", status
    assert not torch.equal(reference, model(x))  # the model really is stochastic


@check("has_streaming")
def _has_streaming(tmp_path):
    model, x = _mlp(), _x()
    streamed = tl.trace(model, x, stream_to=tmp_path / "streamed")
    in_memory = tl.trace(model, x)
    assert streamed.labels == in_memory.labels
    for op in in_memory:
        assert torch.equal(streamed[op.label].out, op.out), op.label
    assert tl.load(tmp_path / "streamed").labels == in_memory.labels


@check("structure_only_capture")
def _structure_only(tmp_path):
    model, x = _mlp(), _x()
    trace = tl.trace(model, x, structure_only=True)
    assert trace.labels == tl.trace(model, x).labels
    with pytest.raises(PayloadUnavailableError) as info:
        trace["relu_1"].out
    assert info.value.code == "structure_only"


@check("has_validation_replay")
def _has_validation_replay(tmp_path):
    model, x = _mlp(), _x()
    assert tl.validate(model, x, scope="forward")
    protocol = get_backend_spec("torch").protocol()
    captured = protocol.capture(model, x, None)
    assert protocol.validate(captured, model(x)).state == "passed"
    assert protocol.validate(captured, model(x) * 2).state == "failed"


@check("payload_materialization")
def _payload_materialization(tmp_path):
    model, x = _mlp(), _x()
    trace = tl.trace(model, x)
    trace.save(tmp_path / "saved")
    loaded = tl.load(tmp_path / "saved")
    for op in trace:
        value = loaded[op.label].out
        assert type(value) is torch.Tensor and torch.equal(value, op.out), op.label


def test_table_covers_the_spec_names_once():
    assert set(TORCH_CAPABILITIES) == {
        "backward_capture",
        "fastlog",
        "can_intervene",
        "rng_replay",
        "has_streaming",
        "structure_only_capture",
        "has_validation_replay",
        "payload_materialization",
        "intermediate_derived_grads",
    }


def test_every_supported_row_has_a_check():
    supported = {name for name, row in TORCH_CAPABILITIES.items() if row.supported}
    assert set(CHECKS) == supported


@pytest.mark.parametrize("name", [n for n, r in TORCH_CAPABILITIES.items() if r.supported])
def test_supported_row_works(name, tmp_path):
    require_capability(get_backend_spec("torch").protocol(), name)  # no refusal
    CHECKS[name](tmp_path)


@pytest.mark.parametrize("name", [n for n, r in TORCH_CAPABILITIES.items() if not r.supported])
def test_unsupported_row_refuses_with_its_code(name):
    row = TORCH_CAPABILITIES[name]
    protocol = get_backend_spec("torch").protocol()
    requests = [lambda: require_capability(protocol, name)]
    if row.option is not None:
        requests.append(lambda: protocol.capture(_mlp(), _x(), None, **{row.option: True}))
        requests.append(lambda: tl.trace(_mlp(), _x(), **{row.option: True}))
    for request in requests:
        with pytest.raises(CapabilityUnsupportedError) as info:
            request()
        assert info.value.code == row.refusal_code
        assert row.instead and row.instead in str(info.value)
