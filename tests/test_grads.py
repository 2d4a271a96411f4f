"""Backward capture: ``tl.trace(..., save_grads=True)`` then ``trace.backward()``.

Captured grads are compared with gradients computed independently on a plain run of a fresh
copy of the model (module outputs kept by forward hooks, parameters and inputs as leaves),
with ``torch.autograd.grad`` of the same loss.
"""

from __future__ import annotations

import gc
import sys
import warnings
import weakref
from pathlib import Path

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.capture.tree import flatten
from torchlens.errors import GradUnavailableError, IntermediateDerivedGradsUnsupportedError
from torchlens.replay.backward import check_backward, validate_backward

try:
    from tests.models import ZOO_BY_NAME
except ImportError:  # repository root not on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from models import ZOO_BY_NAME

# MLP, conv + batch norm, attention, LSTM/GRU, in-place, shared weights, loops, multi-output...
GRAD_CASES = [
    "mlp_tiny",
    "mlp_sequential",
    "conv2d_net",
    "batchnorm_eval",
    "batchnorm_train",
    "residual_blocks",
    "multihead_attention",
    "hand_attention",
    "transformer_encoder_layer",
    "lstm",
    "gru_bidirectional",
    "hand_rnn_loop",
    "rnn_cell_loop",
    "relu_inplace",
    "inplace_arith",
    "masked_fill_inplace",
    "tied_weights",
    "shared_module_aliases",
    "repeated_submodule",
    "split_chunk_unbind",
    "dropout_train",
    "no_grad_inside",
    "data_dependent_loop",
    "float64_model",
    "fn_elementwise",
]
# cases whose every grad is proved; the others hold grads autograd cannot separate
VALIDATED_CASES = [name for name in GRAD_CASES if name != "rnn_cell_loop"]


def _loss(output) -> torch.Tensor:
    """Sum of all floating outputs' sums, written independently of torchlens."""
    terms = [t.sum() for _, t in flatten(output)[0] if t.requires_grad and t.is_floating_point()]
    return torch.stack([t.to(torch.float64) for t in terms]).sum()


def _plain_reference(case):
    """Grads of a plain run: module outputs (in call order), parameters, inputs."""
    model = case.make_model()
    args, kwargs = case.make_inputs()
    calls, handles = [], []
    if isinstance(model, nn.Module):
        for address, module in model.named_modules():
            if not address:
                continue

            def pre(mod, a, k):
                calls.append(None)
                mod._grad_test_stack = [*getattr(mod, "_grad_test_stack", []), len(calls) - 1]

            def post(mod, a, k, out):
                outs = [t for _, t in flatten(out)[0] if t.requires_grad]
                calls[mod._grad_test_stack.pop()] = [(t, t._version) for t in outs]

            handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
            handles.append(module.register_forward_hook(post, with_kwargs=True))
    torch.manual_seed(0)
    try:
        out = model(*args, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    targets = []
    for i, outs in enumerate(calls):
        for j, (t, version) in enumerate(outs or []):
            if t._version == version:  # not modified in place later
                targets.append((("module", i, j), t))
    if isinstance(model, nn.Module):
        targets += [(("param", n), p) for n, p in model.named_parameters()]
    leaves = [t for _, t in flatten((args, kwargs))[0]]
    targets += [(("input", i), t) for i, t in enumerate(leaves) if t.requires_grad]
    grads = torch.autograd.grad(_loss(out), [t for _, t in targets], allow_unused=True)
    return {key: grad for (key, _), grad in zip(targets, grads)}


def _label_for(trace, key, model):
    kind = key[0]
    if kind == "module":  # calls of real modules (opened functions are calls too)
        addresses = {address for address, _ in model.named_modules()}
        call = [c for c in trace.modules[1:] if c.address in addresses][key[1]]
        labels = [label for label in call.outputs if trace[label].requires_grad]
        return labels[key[2]]
    if kind == "param":
        return key[1] if key[1] in trace else None
    return [s.label for s in trace.inputs if s.requires_grad][key[1]]


@pytest.mark.parametrize("name", GRAD_CASES)
def test_captured_grads_match_plain_autograd(name):
    case = ZOO_BY_NAME[name]
    expected = _plain_reference(case)
    model, (args, kwargs) = case.make_model(), case.make_inputs()
    torch.manual_seed(0)
    trace = tl.trace(model, args, kwargs, save_grads=True)
    trace.backward()
    checked = 0
    for key, want in expected.items():
        label = _label_for(trace, key, model)
        if label is None:
            continue
        try:
            got = trace[label].grad
        except GradUnavailableError as err:
            assert want is None or not want.any() or err.code == "grad_aliased", (label, err)
            continue
        want = torch.zeros_like(got) if want is None else want
        torch.testing.assert_close(got, want.to(got.dtype), msg=f"{name}: {label}")
        checked += 1
    assert checked >= 1


@pytest.mark.parametrize("name", VALIDATED_CASES)
def test_backward_validation_passes(name):
    case = ZOO_BY_NAME[name]
    model, (args, kwargs) = case.make_model(), case.make_inputs()
    torch.manual_seed(0)
    status = validate_backward(model, args, kwargs)
    assert status.state == "passed", str(status)
    assert status.replayed == status.ops
    assert set(status.arms) == {"ground_truth", "replay"}


def test_validate_scope_backward():
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    assert tl.validate(model, torch.randn(2, 4), scope="backward")
    assert model[0].weight.grad is None  # validation leaves the model's .grad alone


def _traced_mlp(**kwargs):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))
    x = torch.randn(5, 4)
    return model, x, tl.trace(model, x, save_grads=True, **kwargs)


def test_corrupted_grad_fails_validation_naming_the_op():
    model, x, trace = _traced_mlp()
    trace.backward()
    assert check_backward(trace).state == "passed"
    trace.grads["relu_1"].mul_(1.5)  # corrupt one captured grad
    status = check_backward(trace)
    assert status.state == "failed"
    assert "relu_1" in {f.label for f in status.failures}
    assert all(f.arm == "replay" for f in status.failures)


def test_corrupted_parameter_grad_fails_ground_truth():
    from torchlens.replay.backward import reference_grads

    model, x, trace = _traced_mlp()
    trace.backward()
    reference = reference_grads(model, (x,), {}, trace.rng_state)
    assert check_backward(trace, reference).state == "passed"
    trace.grads["2.weight"].add_(0.1)
    failed = {(f.label, f.arm) for f in check_backward(trace, reference).failures}
    assert ("2.weight", "ground_truth") in failed


def test_inplace_op_grads_equal_out_of_place_twin():
    def inplace(x, w):
        h = x @ w
        h.mul_(2)
        h.relu_()
        return h.sum(0)

    def out_of_place(x, w):
        h = x @ w
        h = h.mul(2)
        h = h.relu()
        return h.sum(0)

    x, w = torch.randn(5, 4), torch.randn(4, 3, requires_grad=True)
    a = tl.trace(inplace, (x, w), save_grads=True)
    b = tl.trace(out_of_place, (x, w), save_grads=True)
    a.backward()
    b.backward()
    assert [op.func_name for op in a] == ["matmul", "mul_", "relu_", "sum"]
    for op_a, op_b in zip(a, b):
        torch.testing.assert_close(op_a.grad, op_b.grad)
    # the matmul's grad is w.r.t. its own value, not the value after relu_ overwrote it
    h = x @ w.detach()
    torch.testing.assert_close(a["matmul_1"].grad, 2.0 * (h > 0).float())
    torch.testing.assert_close(a["input_2"].grad, x.T @ (2.0 * (h > 0).float()))


def test_multi_output_piece_off_the_loss_path_has_no_grad():
    def fn(x):
        a, b = x.split(2, dim=1)
        return a * 3

    trace = tl.trace(fn, torch.randn(2, 4, requires_grad=True), save_grads=True)
    trace.backward()
    torch.testing.assert_close(trace["split_1:0"].grad, torch.full((2, 2), 3.0))
    with pytest.raises(GradUnavailableError) as err:
        trace["split_1:1"].grad
    assert err.value.code == "no_grad"
    assert "path" in str(err.value)
    assert "split_1:1" not in trace.grads
    expected = torch.cat([torch.full((2, 2), 3.0), torch.zeros(2, 2)], dim=1)
    torch.testing.assert_close(trace["input_1"].grad, expected)


def test_grad_errors_say_why():
    model, x, trace = _traced_mlp()
    with pytest.raises(GradUnavailableError) as err:
        trace["linear_1"].grad
    assert err.value.code == "backward_not_run"
    with pytest.raises(GradUnavailableError) as err:
        tl.trace(model, x)["linear_1"].grad
    assert err.value.code == "grads_not_captured"
    with pytest.raises(GradUnavailableError) as err:
        tl.trace(model, x).backward()
    assert err.value.code == "grads_not_captured"

    def fn(x, w):
        with torch.no_grad():
            scale = (w * 2).sum()
        return x @ w * scale

    trace = tl.trace(
        fn, (torch.randn(2, 3), torch.randn(3, 3, requires_grad=True)), save_grads=True
    )
    trace.backward()
    with pytest.raises(GradUnavailableError) as err:
        trace["mul_1"].grad  # computed under torch.no_grad
    assert err.value.code == "no_grad"
    assert "without gradient tracking" in str(err.value)
    assert trace["matmul_1"].grad.shape == (2, 3)


def test_intermediate_derived_grads_refused():
    with pytest.raises(IntermediateDerivedGradsUnsupportedError) as err:
        tl.trace(nn.Linear(2, 2), torch.randn(1, 2), intermediate_derived_grads=True)
    assert err.value.code == "intermediate_derived_grads_unsupported"
    assert "save_grads=True" in str(err.value)


def test_hooks_removed_after_backward():
    model, x, trace = _traced_mlp()
    assert model[0].weight._backward_hooks  # hooked while waiting for backward
    trace.backward(retain_graph=True)
    assert trace.grad_session.handles == {}
    assert not model[0].weight._backward_hooks
    first = trace["linear_1"].grad.clone()
    trace.output.mul(5).sum().backward()  # hooks gone: a second pass records nothing
    torch.testing.assert_close(trace["linear_1"].grad, first)


def test_backward_twice_raises_pytorch_error():
    model, x, trace = _traced_mlp()
    trace.backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        trace.backward()


def test_plain_loss_backward_and_custom_loss():
    model, x, trace = _traced_mlp()
    (trace.output**2).sum().backward()
    out = model(x)
    grads = torch.autograd.grad((out**2).sum(), [out, model[2].weight])
    torch.testing.assert_close(trace["linear_2"].grad, grads[0])
    torch.testing.assert_close(trace.grads["2.weight"], grads[1])
    assert trace.grad_session.handles == {}

    model, x, trace = _traced_mlp()
    trace.backward(lambda out: out[:, 0].sum())
    expected = torch.zeros(5, 3)
    expected[:, 0] = 1
    torch.testing.assert_close(trace["linear_2"].grad, expected)


def test_other_backward_passes_do_not_leak_into_the_trace():
    model, x, trace = _traced_mlp()
    model(torch.randn(5, 4)).sum().backward()  # an unrelated step on the same model
    with pytest.raises(GradUnavailableError) as err:
        trace.grads["0.weight"]
    assert err.value.code == "backward_not_run"
    model.zero_grad()
    trace.backward()
    torch.testing.assert_close(trace.grads["0.weight"], model[0].weight.grad)


def test_deleting_the_trace_removes_hooks_without_gc():
    model, x, trace = _traced_mlp()
    ref = weakref.ref(trace)
    gc.disable()
    try:
        del trace
        assert ref() is None  # no reference cycle keeps it alive
    finally:
        gc.enable()
    assert not model[0].weight._backward_hooks


def test_shared_parameter_grad_is_the_total():
    lin = nn.Linear(3, 3)

    def fn(x):
        return lin(torch.tanh(lin(x)))

    x = torch.randn(2, 3)
    trace = tl.trace(fn, x, save_grads=True)
    trace.backward()
    (w_grad,) = torch.autograd.grad(fn(x).sum(), [lin.weight])
    weight = trace["linear_1"].parents[1]  # one source, read by both calls
    assert trace["linear_2"].parents[1] == weight
    torch.testing.assert_close(trace[weight].grad, w_grad)


def test_passthrough_op_shares_grad_only_when_unambiguous():
    def clean(x):
        return (x.contiguous() * 2).sum(0)

    def shared(x):
        y = x * 1.0
        return y.sum() + (y.contiguous() * 2).sum()

    trace = tl.trace(clean, torch.randn(2, 3, requires_grad=True), save_grads=True)
    trace.backward()
    torch.testing.assert_close(trace["contiguous_1"].grad, torch.full((2, 3), 2.0))
    trace = tl.trace(shared, torch.randn(2, 3, requires_grad=True), save_grads=True)
    trace.backward()
    with pytest.raises(GradUnavailableError) as err:
        trace["contiguous_1"].grad
    assert err.value.code == "grad_aliased"
    torch.testing.assert_close(trace["mul_1"].grad, torch.full((2, 3), 3.0))


def test_composite_multi_output_and_view_writes_are_unverified_not_passed():
    for name, aliased in [("rnn_cell_loop", "lstm_cell_1:1"), ("inplace_on_view", "mul__1")]:
        case = ZOO_BY_NAME[name]
        status = validate_backward(case.make_model(), *case.make_inputs())
        assert status.state == "unverified", str(status)
        assert not status.failures
        assert aliased in {gap.label for gap in status.unchecked}


def test_save_selection_limits_kept_grads():
    model, x, trace = _traced_mlp(save=tl.func("relu"))
    trace.backward()
    h = model[1](model[0](x))
    (expected,) = torch.autograd.grad(model[2](h).sum(), [h])
    torch.testing.assert_close(trace["relu_1"].grad, expected)
    with pytest.raises(GradUnavailableError) as err:
        trace["linear_1"].grad
    assert err.value.code == "not_saved"
    assert set(trace.grads) >= {"relu_1", "0.weight", "2.bias"}
    assert check_backward(trace).state == "unverified"  # unkept grads are not proved


def test_save_grads_keeps_gradients_of_module_outputs_selected_by_save():
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)), torch.randn(2, 4)
    trace = tl.trace(model, x, save=tl.module("1").output, save_grads=True)
    trace.backward()
    h = model[1](model[0](x))
    (expected,) = torch.autograd.grad(model[2](h).sum(), [h])
    torch.testing.assert_close(trace["relu_1"].out, h)
    torch.testing.assert_close(trace["relu_1"].grad, expected)
    with pytest.raises(GradUnavailableError) as err:
        trace["linear_1"].grad  # not selected: still refused, with the reason
    assert err.value.code == "not_saved"
    assert "relu_1" in trace.grads and "linear_2" not in trace.grads


@pytest.mark.parametrize(
    ("name", "block", "inner"),
    [
        ("gpt2", "GPT2Block", "GPT2Attention"),  # the attention output is an eval Dropout's
        ("bert", "BertLayer", "BertSelfOutput"),
        ("llama", "LlamaDecoderLayer", "LlamaMLP"),
    ],
)
def test_save_grads_of_block_outputs_of_tiny_lms_equal_those_of_a_full_capture(name, block, inner):
    from tests import _tiny_llms as tiny

    model = getattr(tiny, name)().requires_grad_(True)
    ids = tiny.ids(1)

    def loss(out):
        return tiny.main_output(out)[0, -1, 7]

    selected = tl.module(type=block).output | tl.module(type=inner).output
    some = tl.trace(model, ids, save=selected, save_grads=True)
    some.backward(loss)
    every = tl.trace(model, ids, save_grads=True)
    every.backward(loss)
    kept = [op.label for op in some if op.has_out]
    assert len(kept) == 4  # two blocks, two of their submodules
    if name == "gpt2":
        assert any("returns_argument" in some[label].meta for label in kept)
    for label in kept:
        assert some[label].grad.abs().max() > 0
        torch.testing.assert_close(some[label].grad, every[label].grad)
    assert not any(op.label in some.grads for op in some if not op.has_out)


# -- gradients on disk ------------------------------------------------------------------------


def _small_model_and_input():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)), torch.randn(2, 4)


def test_streamed_trace_keeps_its_gradients(tmp_path):
    model, x = _small_model_and_input()
    trace = tl.trace(model, x, save_grads=True, stream_to=tmp_path / "run")
    trace.backward()
    loaded = tl.load(tmp_path / "run")
    for op in trace:
        assert torch.equal(loaded[op.label].grad, op.grad)
    assert torch.equal(loaded.grads["0.weight"], trace.grads["0.weight"])
    assert set(loaded.grads) == set(trace.grads)


def test_saved_trace_keeps_gradients_and_refuses_a_new_backward(tmp_path):
    model, x = _small_model_and_input()
    trace = tl.trace(model, x, save_grads=True)
    trace.backward()
    loaded = tl.load(tl.save(trace, tmp_path / "run"))
    assert torch.equal(loaded["relu_1"].grad, trace["relu_1"].grad)
    with pytest.raises(GradUnavailableError) as err:
        loaded.backward()
    assert err.value.code == "grads_not_captured"


def test_saved_before_backward_has_no_gradients(tmp_path):
    model, x = _small_model_and_input()
    trace = tl.trace(model, x, save_grads=True)
    loaded = tl.load(tl.save(trace, tmp_path / "run"))
    assert not (tmp_path / "run" / "grads.safetensors").exists()
    with pytest.raises(GradUnavailableError) as err:
        loaded["relu_1"].grad
    assert err.value.code == "grads_not_captured"


def test_corrupt_gradient_file_is_a_typed_error(tmp_path):
    model, x = _small_model_and_input()
    trace = tl.trace(model, x, save_grads=True)
    trace.backward()
    root = tl.save(trace, tmp_path / "run")
    (root / "grads.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(tl.errors.TraceFileError) as err:
        tl.load(root)
    assert err.value.code == "corrupt_payload"


@pytest.mark.parametrize(
    "off", [torch.no_grad, torch.inference_mode, lambda: torch.set_grad_enabled(False)]
)
def test_save_grads_with_gradients_off_is_refused_at_trace_time(off):
    with off(), pytest.raises(tl.errors.InvalidArgumentError) as err:
        tl.trace(nn.Linear(3, 2), torch.randn(2, 3), save_grads=True)
    assert err.value.code == "save_grads_no_grad" and "no_grad" in str(err.value)
    with off():  # without save_grads a no_grad capture is fine
        assert tl.trace(nn.Linear(3, 2), torch.randn(2, 3)).labels == ["linear_1"]


class _ChunkFirst(torch.autograd.Function):
    """Reformer's reversible block in small: the forward runs without grad tracking and
    starts with a view of its input, which keeps ``requires_grad`` but takes no gradient."""

    @staticmethod
    def forward(ctx, x):
        a, b = torch.chunk(x, 2, dim=-1)
        return a * 2 + b

    @staticmethod
    def backward(ctx, grad):
        return torch.cat([2 * grad, grad], dim=-1)


class _ChunkFirstModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        return _ChunkFirst.apply(torch.cat([h, h], dim=-1))


def test_a_view_made_inside_a_custom_function_makes_its_input_unverified_not_failed():
    from torchlens.capture.grads import grad_untracked

    torch.manual_seed(0)
    model, x = _ChunkFirstModel(), torch.randn(3, 4)
    trace = tl.trace(model, x, save_grads=True)
    trace.backward()
    expected = torch.cat([2 * torch.ones(3, 4), torch.ones(3, 4)], dim=-1)
    assert torch.equal(trace["cat_1"].grad, expected)  # the captured grad is right
    chunk = trace["chunk_1:0"]
    assert chunk.requires_grad and grad_untracked(chunk)
    assert not grad_untracked(trace["cat_1"]) and grad_untracked(trace["mul_1"])
    status = validate_backward(model, x)
    assert status.state == "unverified", str(status)
    assert {f.label for f in status.failures} == set()


class _Reversible(torch.autograd.Function):
    """A reversible layer (Reformer, RevNet): the backward recomputes the forward and
    calls ``.backward()`` on it, which puts the layer's parameter grads into ``.grad``."""

    @staticmethod
    def forward(ctx, x, layer):
        ctx.layer = layer
        ctx.save_for_backward(x)
        with torch.no_grad():
            return x + layer(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        with torch.enable_grad():
            x = x.detach().requires_grad_()
            (x + ctx.layer(x)).backward(grad)
        return x.grad, None


class _ReversibleModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp, self.layer = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        return _Reversible.apply(self.inp(x), self.layer).sum()


def test_grads_a_reversible_layer_puts_into_dot_grad_are_the_reference_too():
    from torchlens.replay.backward import reference_grads

    torch.manual_seed(0)
    model, x = _ReversibleModel(), torch.randn(3, 4)
    model(x).backward()
    expected = model.layer.weight.grad.clone()
    model.layer.weight.grad = marker = torch.full_like(expected, 7.0)
    reference = reference_grads(model, (x,), {}, None)
    torch.testing.assert_close(reference["layer.weight"], expected)
    assert model.layer.weight.grad is marker  # the caller's .grad is put back
    status = validate_backward(model, x)
    assert status.state == "unverified" and not status.failures, str(status)


def test_backward_validation_through_a_reentrant_checkpoint_is_unverified_not_raised():
    from torch.utils.checkpoint import checkpoint

    class Checkpointed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
            self.head = nn.Linear(4, 2)

        def forward(self, x):
            return self.head(checkpoint(self.block, x, use_reentrant=True))

    torch.manual_seed(0)
    model, x = Checkpointed().train(), torch.randn(2, 4, requires_grad=True)
    status = validate_backward(model, x)  # autograd.grad is refused there: .grad is read
    assert status.state == "unverified" and not status.failures, str(status)
    assert model.head.weight.grad is None and x.grad is None  # .grad put back


class _SiblingSlices(nn.Module):
    """A neural spline flow's ``unnormalized_widths /= sqrt(hidden)``: a slice written in
    place after a sibling slice of the same tensor was taken, the sibling read later."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 9)

    def forward(self, x):
        p = self.lin(x)
        w, d = p[..., :3], p[..., 6:]
        w /= 2.0
        return (w.exp() + d.cos()).sum()


def test_a_slice_taken_before_a_write_through_its_sibling_is_aliased_not_failed():
    torch.manual_seed(0)
    model, x = _SiblingSlices(), torch.randn(5, 4)
    p = model.lin(x)  # the out-of-place twin gives the reference
    weight = model.lin.weight
    loss = ((p[..., :3] / 2.0).exp() + p[..., 6:].cos()).sum()
    want_p, want_weight = torch.autograd.grad(loss, [p, weight])
    trace = tl.trace(model, x, save_grads=True)
    trace.backward()
    torch.testing.assert_close(trace["linear_1"].grad, want_p)
    torch.testing.assert_close(trace["lin.weight"].grad, want_weight)
    stale = trace["getitem_2"]  # d: its read after the write has a node of its own
    (refresh,) = stale.children
    assert trace[refresh].func_name == "refresh"
    torch.testing.assert_close(trace[refresh].grad, want_p[..., 6:])
    with pytest.raises(GradUnavailableError) as err:
        stale.grad
    assert err.value.code == "grad_aliased" and refresh in str(err.value)
    status = validate_backward(model, x)
    assert status.state == "unverified" and not status.failures, str(status)
    reasons = {gap.label: gap.reason for gap in status.unchecked}
    assert "CopySlices" in reasons["getitem_2"] and "linear_1" not in reasons


class _EnergyModel(nn.Module):
    """A forward that differentiates itself (residual flows, energy models, PINNs)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 1))
        self.w = nn.Parameter(torch.tensor(0.7))

    def forward(self, x):
        with torch.enable_grad():
            x = x.requires_grad_(True)
            e = self.net(x)
            (g,) = torch.autograd.grad(e.sum(), x, create_graph=True)
        return (g.pow(2).sum(-1) + self.w * e.squeeze(-1)).mean()


def test_autograd_grad_inside_the_forward_leaves_the_real_backward_its_hooks():
    torch.manual_seed(0)
    model, x = _EnergyModel(), torch.randn(5, 2)
    outputs = []
    handle = model.net[1].register_forward_hook(lambda mod, a, out: outputs.append(out))
    plain_x = x.clone()
    loss = model(plain_x)
    handle.remove()
    names = [name for name, _ in model.named_parameters()]
    tensors = [*model.parameters(), plain_x, outputs[0]]
    want = dict(zip([*names, "x", "tanh"], torch.autograd.grad(loss, tensors)))
    trace = tl.trace(model, x.clone(), save_grads=True)
    trace.backward()
    for name in names:
        torch.testing.assert_close(trace[name].grad, want[name], msg=name)
    torch.testing.assert_close(trace["requires_grad__1"].grad, want["x"])
    torch.testing.assert_close(trace["tanh_1"].grad, want["tanh"])  # hidden path included
    status = validate_backward(model, x.clone())
    assert status.state == "unverified" and not status.failures, str(status)
    reasons = {gap.label: gap.reason for gap in status.unchecked}
    assert "'grad_1'" in reasons["tanh_1"] and "create_graph" in reasons["tanh_1"]


def test_an_input_the_forward_makes_require_grad_is_checked_where_it_does():
    class Tracking(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 3)

        def forward(self, x):
            x.requires_grad_(True)
            return self.lin(x).tanh().sum()

    torch.manual_seed(0)
    status = validate_backward(Tracking(), torch.randn(2, 4))
    assert status.state == "passed", str(status)


def test_backward_validation_leaves_a_populated_grad_as_it_was():
    torch.manual_seed(0)
    model, x = nn.Linear(4, 2), torch.randn(3, 4)
    model(x).pow(2).sum().backward()  # a step accumulating micro-batches leaves .grad
    before = model.weight.grad.clone()
    assert tl.replay(model, (x,), scope="backward").state == "passed"
    assert torch.equal(model.weight.grad, before)  # nothing added into it in place


def test_a_full_backward_hook_makes_its_view_unverified_not_failed():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    calls = []
    model[0].register_full_backward_hook(lambda module, grad_in, grad_out: calls.append(1))
    with warnings.catch_warnings():  # torch warns that no input requires grad
        warnings.simplefilter("ignore")
        status = tl.replay(model, (torch.randn(5, 4),), scope="backward")
    # the hook's autograd.Function returns a view the trace records but cannot hook
    assert status.state == "unverified" and not status.failures, status
    assert "full backward hooks" in str(status)
    assert calls  # the user's hook still ran


def test_a_loss_fn_returning_a_float_is_a_typed_error():
    model = nn.Linear(4, 2)
    trace = tl.trace(model, torch.randn(3, 4), save_grads=True)
    with pytest.raises(tl.errors.InvalidArgumentError) as caught:
        trace.backward(lambda out: out.sum().item())
    assert caught.value.code == "bad_loss" and ".item()" in str(caught.value)
