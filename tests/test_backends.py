"""The backend protocol, the registry and the torch adapter over ``tl.trace`` and replay."""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.overrides import _get_current_function_mode_stack

import torchlens as tl
from torchlens.backends import (
    CAPABILITY_NAMES,
    TORCH_CAPABILITIES,
    BackendProtocol,
    BackendSpec,
    TorchBackend,
    backend_specs,
    get_backend_spec,
    register_backend_spec,
    require_capability,
    unregister_backend_spec,
)
from torchlens.errors import (
    CapabilityUnsupportedError,
    IntermediateDerivedGradsUnsupportedError,
    InvalidArgumentError,
    LookupFailedError,
    UnknownBackendError,
)

try:
    from tests.models import ZOO_BY_NAME
except ImportError:  # repository root not on sys.path (e.g. bare `pytest`)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from models import ZOO_BY_NAME

SPEC = Path(__file__).resolve().parents[2] / "shared" / "spec" / "pytorch-backend.md"
PARITY_CASES = [
    "mlp_tiny",
    "conv2d_net",
    "relu_inplace",
    "split_chunk_unbind",
    "nested_inputs",
    "kwargs_mixed",
    "fn_elementwise",
]


@pytest.fixture
def backend() -> TorchBackend:
    return get_backend_spec("torch").protocol()


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)).eval()


# -- protocol and identity ----------------------------------------------------------------
def test_torch_protocol_fills_the_protocol(backend):
    assert isinstance(backend, BackendProtocol)
    assert (backend.name, backend.maturity, backend.materialization) == (
        "torch",
        "stable",
        "tensor",
    )
    assert tuple(backend.capabilities) == CAPABILITY_NAMES


def test_an_object_missing_a_member_is_not_a_backend():
    class NoValidate:
        name, maturity, materialization, capabilities = "x", "experimental", "tensor", {}

        def reference_output(self, model, args, kwargs): ...

        def capture(self, model, args, kwargs=None, **options): ...

    assert not isinstance(NoValidate(), BackendProtocol)


# -- registry -------------------------------------------------------------------------------
def test_unknown_backend_is_a_typed_error_listing_known_names():
    with pytest.raises(UnknownBackendError) as info:
        get_backend_spec("jax")
    assert info.value.code == "unknown_backend"
    assert isinstance(info.value, LookupFailedError)
    assert "'jax'" in str(info.value) and "'torch'" in str(info.value)


def test_register_lists_torch_first_and_refuses_duplicates():
    spec = BackendSpec("mirror", "experimental", TorchBackend, "torch under another name")
    register_backend_spec(spec)
    try:
        assert [s.name for s in backend_specs()][0] == "torch"
        assert get_backend_spec("mirror") is spec
        with pytest.raises(InvalidArgumentError) as info:
            register_backend_spec(BackendSpec("mirror", "experimental", TorchBackend))
        assert info.value.code == "backend_exists"
        replacement = BackendSpec("mirror", "preview", TorchBackend)
        assert register_backend_spec(replacement, replace=True) is replacement
    finally:
        unregister_backend_spec("mirror")
    assert "mirror" not in [s.name for s in backend_specs()]
    with pytest.raises(UnknownBackendError):
        unregister_backend_spec("mirror")


def test_torch_cannot_be_unregistered_and_specs_are_frozen():
    with pytest.raises(InvalidArgumentError) as info:
        unregister_backend_spec("torch")
    assert info.value.code == "reference_backend"
    with pytest.raises(dataclasses.FrozenInstanceError):
        get_backend_spec("torch").name = "other"
    with pytest.raises(InvalidArgumentError):
        register_backend_spec("torch")


def test_each_protocol_call_builds_a_fresh_adapter():
    spec = get_backend_spec("torch")
    assert spec.protocol() is not spec.protocol()
    assert spec.maturity == spec.protocol().maturity == "stable"


# -- capture is tl.trace ---------------------------------------------------------------------
@pytest.mark.parametrize("name", PARITY_CASES)
def test_capture_gives_the_same_ops_and_payloads_as_tl_trace(backend, name):
    case = ZOO_BY_NAME[name]
    model = case.make_model()
    args, kwargs = case.make_inputs()
    expected = tl.trace(model, args, kwargs)
    args, kwargs = case.make_inputs()
    got = backend.capture(model, args, kwargs)
    assert isinstance(got, tl.Trace)
    assert got.labels == expected.labels
    for a, b in zip(got, expected):
        assert (a.func_name, a.parents, a.module_stack) == (b.func_name, b.parents, b.module_stack)
        assert torch.equal(a.out, b.out), a.label
    assert [s.label for s in got.sources] == [s.label for s in expected.sources]


def test_capture_accepts_a_bare_tensor_and_none_kwargs(backend):
    model, x = _mlp(), torch.randn(2, 4)
    trace = backend.capture(model, x, None)
    assert [op.func_name for op in trace] == ["linear", "relu", "linear"]
    assert torch.equal(trace.output, model(x))


def test_capture_passes_options_through(backend):
    trace = backend.capture(_mlp(), torch.randn(2, 4), None, structure_only=True)
    assert trace.structure_only
    assert trace.labels == ["linear_1", "relu_1", "linear_2"]


# -- reference_output is pristine -------------------------------------------------------------
def test_reference_output_is_the_plain_forward(backend):
    model, x = _mlp(), torch.randn(2, 4)
    assert torch.equal(backend.reference_output(model, x, None), model(x))
    assert torch.equal(backend.reference_output(model, (x,), {}), model(x))


class _CallsReference(nn.Module):
    """Runs the torch reference arm on its own submodule in the middle of its forward."""

    def __init__(self, backend: TorchBackend) -> None:
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
        self.backend = backend
        self.references: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.backend is not None:
            self.references.append(self.backend.reference_output(self.inner, x * 1.0, None))
        return self.inner(x) + 1


def test_reference_output_inside_a_running_capture_adds_nothing(backend):
    torch.manual_seed(0)
    model, x = _CallsReference(backend), torch.randn(3, 4)
    trace = tl.trace(model, x)
    # The reference run's linear/tanh are absent; ops after it are recorded as usual.
    assert [op.func_name for op in trace] == ["mul", "linear", "tanh", "add"]
    assert [m.name for m in trace.modules] == ["<root>:1", "inner:1", "inner.0:1", "inner.1:1"]
    assert trace["linear_1"].parents[0] == "input_1"
    (reference,) = model.references
    assert torch.equal(reference, model.inner(x))
    assert torch.equal(trace.output, model.inner(x) + 1)
    assert trace["tanh_1"].children == ["add_1"]


def test_reference_output_ignores_the_outer_captures_interventions(backend):
    torch.manual_seed(0)
    model, x = _CallsReference(backend), torch.randn(3, 4)
    zero = {tl.func("tanh"): lambda t, op: torch.zeros_like(t)}
    trace = tl.trace(model, x, intervene=zero)
    (reference,) = model.references
    assert torch.equal(reference, model.inner(x))  # pristine, not zeroed
    assert torch.equal(trace.output, torch.ones(3, 4))  # the traced call was zeroed


def test_reference_output_leaves_capture_and_global_state_as_they_were(backend):
    modes_before = list(_get_current_function_mode_stack())
    grad_before = torch.is_grad_enabled()
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)).train()
    x = torch.randn(2, 4)
    torch.manual_seed(3)
    backend.reference_output(model, x, None)
    after_reference = torch.get_rng_state()
    torch.manual_seed(3)
    model(x)
    assert torch.equal(after_reference, torch.get_rng_state())  # advanced like a plain call
    assert list(_get_current_function_mode_stack()) == modes_before
    assert torch.is_grad_enabled() == grad_before
    assert tl.capture.active_session() is None


# -- validate returns a status --------------------------------------------------------------
def test_validate_returns_a_status_never_a_bool(backend):
    model, x = _mlp(), torch.randn(2, 4)
    reference = backend.reference_output(model, x, None)
    status = backend.validate(backend.capture(model, x, None), reference)
    assert not isinstance(status, bool)
    assert status.state == "passed", status


def test_validate_fails_against_a_different_reference(backend):
    model, x = _mlp(), torch.randn(2, 4)
    reference = backend.reference_output(model, x, None) + 0.5
    status = backend.validate(backend.capture(model, x, None), reference)
    assert status.state == "failed", status


# -- capabilities are enforced from the table ------------------------------------------------
def test_capture_refuses_intermediate_derived_grads_before_running(backend):
    calls = []
    model = _mlp()
    model.register_forward_pre_hook(lambda *_: calls.append(1))
    for request in (
        lambda: backend.capture(model, torch.randn(2, 4), None, intermediate_derived_grads=True),
        lambda: tl.trace(model, torch.randn(2, 4), intermediate_derived_grads=True),
        lambda: require_capability(backend, "intermediate_derived_grads"),
    ):
        with pytest.raises(IntermediateDerivedGradsUnsupportedError) as info:
            request()
        assert info.value.code == "intermediate_derived_grads_unsupported"
        assert isinstance(info.value, CapabilityUnsupportedError)
        assert "save_grads=True" in str(info.value) and "torch" in str(info.value)
    assert calls == []


def test_false_or_none_does_not_request_a_capability(backend):
    trace = backend.capture(_mlp(), torch.randn(2, 4), None, intermediate_derived_grads=False)
    assert len(trace) == 3


def test_unknown_capability_name_lists_the_known_ones(backend):
    with pytest.raises(InvalidArgumentError) as info:
        require_capability(backend, "time_travel")
    assert info.value.code == "unknown_capability"
    assert "backward_capture" in str(info.value)


def test_capability_records_are_small_and_frozen():
    row = TORCH_CAPABILITIES["fastlog"]
    assert (row.name, row.state, row.refusal_code) == ("fastlog", "supported", None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        row.state = "unsupported"
    with pytest.raises(TypeError):
        TORCH_CAPABILITIES["fastlog"] = row
    for name, row in TORCH_CAPABILITIES.items():
        assert row.name == name
        assert row.state in ("supported", "unsupported")
        assert (row.refusal_code is None) == row.supported, name


def test_capability_table_is_the_spec_table():
    if not SPEC.exists():
        pytest.skip(f"the spec is not checked out next to the repo ({SPEC})")
    rows = re.findall(r"^`(\w+)`\t(supported|unsupported)\t(.+)$", SPEC.read_text(), re.M)
    assert [(r[0], r[1], r[2].strip()) for r in rows] == [
        (c.name, c.state, c.notes) for c in TORCH_CAPABILITIES.values()
    ]


def test_docs_examples_run():
    docs = Path(__file__).resolve().parents[1] / "docs" / "backends.md"
    blocks = re.findall(r"```python\n(.*?)```", docs.read_text(), re.S)
    assert len(blocks) >= 4
    namespace: dict = {}
    try:
        for block in blocks:
            exec(compile(block, str(docs), "exec"), namespace)
    finally:
        if "mine" in [s.name for s in backend_specs()]:
            unregister_backend_spec("mine")
    assert namespace["report"].passed("torch")
