"""Live interventions (``intervene=``) and ``stop_after=`` on ``tl.trace`` and ``tl.record``."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.modules import module as module_hooks
from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack

import torchlens as tl
from torchlens.errors import InterventionError, SelectorMatchError
from torchlens.replay import check_trace

CAPTURES = [tl.trace, tl.record]


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)).eval()


@pytest.mark.parametrize("capture", CAPTURES)
def test_patching_a_value_changes_the_output_as_computed_by_hand(capture):
    model, x = _mlp(), torch.randn(2, 4)
    result = capture(model, x, intervene={tl.label("relu_1"): lambda t, op: t + 1.5})
    lin1, lin2 = model[0], model[2]
    with torch.no_grad():
        expected = lin2(torch.relu(lin1(x)) + 1.5)
    torch.testing.assert_close(result.output.detach(), expected, rtol=0, atol=0)
    assert result.meta["intervened"] == ["relu_1"]
    edited = result["relu_1"]
    assert edited.meta["intervened"] is True
    torch.testing.assert_close(edited.out, torch.relu(lin1(x)).detach() + 1.5)


class Ablated(nn.Module):
    """``mid`` replaced by zeros of its output's shape."""

    def forward(self, x):
        return torch.zeros(x.shape[0], 5)


class ThreeStage(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = nn.Linear(4, 6)
        self.mid = nn.Sequential(nn.Linear(6, 5), nn.Tanh())
        self.last = nn.Linear(5, 2)

    def forward(self, x):
        return self.last(self.mid(torch.relu(self.first(x))))


@pytest.mark.parametrize("capture", CAPTURES)
def test_zero_ablating_a_module_equals_replacing_it_by_zeros(capture):
    torch.manual_seed(0)
    model, x = ThreeStage().eval(), torch.randn(3, 4)
    zero = {tl.module("mid"): lambda t, op: torch.zeros_like(t)}
    result = capture(model, x, intervene=zero)
    model.mid = Ablated()
    torch.testing.assert_close(result.output, model(x), rtol=0, atol=0)
    assert result.meta["intervened"] == ["linear_2", "tanh_1"]


def test_trace_edges_payloads_and_validation_of_an_intervened_trace():
    model, x = _mlp(), torch.randn(2, 4)
    edits = {tl.func("relu"): lambda t, op: t * 0 + 0.25}
    trace = tl.trace(model, x, intervene=edits)
    plain = tl.trace(model, x)
    assert [op.parents for op in trace] == [op.parents for op in plain]
    assert torch.equal(trace["linear_2"].out, trace.output.detach())
    assert trace.meta["interventions"][next(iter(trace.meta["interventions"]))].fn is not None
    reference = tl.record(model, x, intervene=edits).output
    status = check_trace(trace, reference=reference)
    assert status.state == "passed", status
    assert check_trace(plain, reference=reference).state == "failed"


def test_validate_applies_interventions_to_the_ground_truth_rerun():
    model, x = _mlp(), torch.randn(2, 4)
    edits = {tl.func("relu"): lambda t, op: t * 0 + 0.25}
    status = tl.replay(model, x, intervene=edits)
    assert status.state == "passed", status
    assert tl.validate(model, x, intervene=edits)
    with pytest.raises(tl.errors.InvalidArgumentError) as err:
        tl.replay(model, x, intervene=edits, scope="backward")
    assert err.value.code == "bad_scope"


def test_keep_original_and_changes_need_permission():
    model, x = _mlp(), torch.randn(2, 4)
    keep = tl.Intervention(lambda t, op: -t, keep_original=True)
    trace = tl.trace(model, x, intervene={tl.func("relu"): keep})
    key = trace["relu_1"].meta["original_key"]
    torch.testing.assert_close(trace.store.get(key), -trace["relu_1"].out)
    rec = tl.record(model, x, intervene={tl.func("relu"): keep})
    torch.testing.assert_close(
        rec.store.get(rec["relu_1"].meta["original_key"]), -rec["relu_1"].out
    )

    widen = lambda t, op: t.double()  # noqa: E731
    for capture in CAPTURES:
        with pytest.raises(InterventionError) as err:
            capture(model, x, intervene={tl.label("linear_2"): widen})
        assert err.value.code == "changed_dtype"
        with pytest.raises(InterventionError) as err:
            capture(model, x, intervene={tl.label("linear_2"): lambda t, op: t[:1]})
        assert err.value.code == "changed_shape"
        with pytest.raises(InterventionError) as err:
            capture(model, x, intervene={tl.label("linear_2"): lambda t, op: None})
        assert err.value.code == "bad_return"
        allowed = capture(
            model, x, intervene={tl.label("linear_2"): tl.Intervention(widen, allow_changes=True)}
        )
        assert allowed.output.dtype == torch.float64 and allowed["linear_2"].dtype == torch.float64


class InplaceRelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x)
        y.relu_()  # the model keeps using y, not what relu_ returned
        return y * 2


@pytest.mark.parametrize("capture", CAPTURES)
def test_editing_an_inplace_op_reaches_the_models_own_variable(capture):
    torch.manual_seed(0)
    model, x = InplaceRelu(), torch.randn(2, 4)
    result = capture(model, x, intervene={tl.func("relu_"): lambda t, op: torch.full_like(t, 3.0)})
    assert torch.equal(result.output, torch.full((2, 4), 6.0))


def test_intervention_matching_nothing_is_an_error():
    with pytest.raises(SelectorMatchError):
        tl.trace(_mlp(), torch.randn(2, 4), intervene={tl.func("gelu"): lambda t, op: t})


# -- stop_after ---------------------------------------------------------------------------
class CountOps(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.append(getattr(func, "__name__", "?"))
        return func(*args, **(kwargs or {}))


class Logged(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = []
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(4)])
        self.drop = nn.Dropout(0.5)
        self.norm = nn.BatchNorm1d(4)

    def forward(self, x):
        x = self.norm(x)
        for i, layer in enumerate(self.layers):
            self.calls.append(i)
            x = self.drop(torch.tanh(layer(x)))
        return x


@pytest.mark.parametrize("capture", CAPTURES)
def test_stop_after_runs_no_op_after_the_match(capture):
    torch.manual_seed(0)
    model, x = Logged().train(), torch.randn(3, 4)
    with CountOps() as counter:
        result = capture(model, x, stop_after=tl.label("tanh_2"))
    assert model.calls == [0, 1]
    assert counter.names.count("tanh") == 2 and counter.names.count("linear") == 2
    assert (
        "dropout"
        not in counter.names[counter.names.index("tanh", counter.names.index("tanh") + 1) :]
    )
    assert result.halted and result.meta["halted_at"] == "tanh_2" and result.output is None
    assert result["tanh_2"].out.shape == (3, 4)  # the op it halted on keeps its value
    if capture is tl.trace:
        assert result.labels[-1] == "tanh_2" and result.outputs == []


@pytest.mark.parametrize("capture", CAPTURES)
def test_stop_after_leaves_model_hooks_and_rng_clean(capture):
    torch.manual_seed(0)
    model, x = Logged().train(), torch.randn(3, 4)
    stats = model.norm.running_mean.clone(), int(model.norm.num_batches_tracked)
    rng = torch.get_rng_state()
    capture(model, x, stop_after=tl.label("dropout_2"))
    assert torch.equal(torch.get_rng_state(), rng)
    assert torch.equal(model.norm.running_mean, stats[0])
    assert int(model.norm.num_batches_tracked) == stats[1]
    assert not _get_current_function_mode_stack()
    for module in model.modules():
        assert not module._forward_hooks and not module._forward_pre_hooks
    assert not module_hooks._global_forward_hooks
    assert not module_hooks._global_forward_pre_hooks
    model.eval()
    torch.testing.assert_close(model(x), tl.trace(model, x).output)  # still runs normally


def test_stop_after_never_matching_is_an_error():
    with pytest.raises(SelectorMatchError) as err:
        tl.record(_mlp(), torch.randn(2, 4), stop_after=tl.label("tanh_1"))
    assert err.value.code == "no_match"


@pytest.mark.parametrize("capture", CAPTURES)
@pytest.mark.parametrize(
    "rule",
    [tl.module("0").output, tl.label("linear_1") | tl.module("0").output],
    ids=["module_output", "label_or_module_output"],
)
def test_an_edit_applies_once_to_a_value_several_calls_return(capture, rule):
    # nn.Identity returns linear_1 again, so two calls return it; the compound rule also
    # matches linear_1 when it is made. A forward hook on module "0" edits it once.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Identity(), nn.Linear(4, 2)).eval()
    x = torch.randn(3, 4)
    handle = model[0].register_forward_hook(lambda module, args, out: out * 0.5)
    with torch.no_grad():
        expected = model(x)
    handle.remove()
    result = capture(model, x, intervene={rule: lambda t: t * 0.5})
    torch.testing.assert_close(result.output.detach(), expected, rtol=0, atol=0)
    assert result.meta["intervened"] == ["linear_1"]
    what_if = tl.trace(model, x).rerun({rule: lambda t: t * 0.5})
    torch.testing.assert_close(what_if.output, expected, rtol=0, atol=0)
