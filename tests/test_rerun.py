"""Post-hoc what-if (``trace.rerun``) and cross-run patching (``torchlens.edits.patch``)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchlens as tl
from tests.models import ZOO, ZOO_BY_NAME
from torchlens import edits
from torchlens.capture.tree import flatten
from torchlens.errors import InterventionError, PayloadUnavailableError, SelectorMatchError
from torchlens.replay.exemptions import VALUE_EXEMPT

# Values that steer Python control flow (``if x.sum() > 0``, ``.item()`` loops) are replayed
# as recorded: an edit that would change the branch gives another answer than a live run.
CONTROL_FLOW = {"conditional_on_value", "data_dependent_loop", "item_scalars"}
# Writes through chains of views: a live edit of any view in the chain breaks the alias.
VIEW_WRITES = {"inplace_on_view"}


def _edit_target(trace):
    """A floating op consumed by other ops, past the middle of the graph if there is one."""
    middle = len(trace.ops) // 2
    floats = [
        op for op in trace.ops[middle:] + trace.ops[:middle][::-1]
        if op.dtype.is_floating_point and not op.is_inplace and op.children
        and op.func_name != "refresh"  # a write seen late: no live run can edit it
        # a live edit of a view written in place breaks the alias (the write no longer
        # reaches the base), so the live graph is not the recorded one: see rerun's docs
        and not any(trace[child].is_inplace for child in op.children)
    ]  # fmt: skip
    return floats[0] if floats else None


def _run(case, **options):
    model, (args, kwargs) = case.make_model(), case.make_inputs()
    torch.manual_seed(0)
    return tl.trace(model, args, kwargs, **options)


@pytest.mark.parametrize(
    "case", [c for c in ZOO if c.name not in CONTROL_FLOW | VIEW_WRITES], ids=str
)
def test_rerun_equals_a_live_intervened_run(case):
    trace = _run(case)
    target = _edit_target(trace)
    if target is None:
        pytest.skip("no floating op consumed by another op")
    edit = {tl.label(target.label): edits.scale(0.5)}
    what_if = trace.rerun(edit)
    live = _run(case, intervene=edit)
    assert what_if.meta["intervened"] == live.meta["intervened"] == [target.label]
    got, want = flatten(what_if.output)[0], flatten(live.output)[0]
    assert len(got) == len(want)
    for (_, a), (_, b) in zip(got, want):
        torch.testing.assert_close(a.detach(), b.detach(), equal_nan=True)
    for op in live.ops:  # every value, not only the outputs (uninitialized memory aside)
        if op.has_out and what_if[op.label].has_out and op.func_name not in VALUE_EXEMPT:
            torch.testing.assert_close(what_if[op.label].out, op.out, equal_nan=True)


def test_rerun_leaves_the_original_untouched_and_recomputes_only_the_cone():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    trace = tl.trace(model, torch.randn(3, 4))
    before = trace["relu_2"].out.clone()
    what_if = trace.rerun({tl.label("linear_2"): edits.zero()})
    torch.testing.assert_close(trace["relu_2"].out, before)
    assert what_if["relu_2"].out.eq(0).all()
    assert what_if["relu_1"].out is trace["relu_1"].out  # upstream: the saved value itself
    torch.testing.assert_close(what_if.output, model[4].bias.expand(3, 2))
    assert what_if.meta["intervened"] == ["linear_2"] and "intervened" not in trace.meta


def test_rerun_with_module_outputs_and_heads():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True).eval()
    x = torch.randn(2, 5, 16)
    trace = tl.trace(layer, x)
    for edit in (
        {tl.module("self_attn").output: edits.zero()},
        {tl.func("scaled_dot_product_attention"): edits.zero(heads=[1])},
    ):
        live = tl.trace(layer, x, intervene=edit)
        torch.testing.assert_close(trace.rerun(edit).output, live.output.detach())


def test_rerun_errors():
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    x = torch.randn(2, 4)
    with pytest.raises(SelectorMatchError):
        tl.trace(model, x).rerun({tl.func("conv2d"): edits.zero()})

    def skip(x):
        return torch.relu(x) + torch.sin(x)

    # sin_1, read beside the edit, was not saved: it is remade from the saved input
    sparse = tl.trace(skip, x, save=tl.func("relu"))
    assert not sparse["sin_1"].has_out
    torch.testing.assert_close(sparse.rerun({tl.label("relu_1"): edits.zero()}).output,
                               torch.sin(x), rtol=0, atol=0)  # fmt: skip
    torch.testing.assert_close(tl.trace(skip, x).rerun({tl.label("relu_1"): edits.zero()}).output,
                               torch.sin(x))  # fmt: skip

    def noisy(x):  # what rand_like drew cannot be remade once left out
        return torch.relu(x) + torch.rand_like(x).sin()

    sparse = tl.trace(noisy, x, save=tl.func("relu"))
    with pytest.raises(PayloadUnavailableError) as info:
        sparse.rerun({tl.label("relu_1"): edits.zero()})
    assert "'sin_1'" in str(info.value) and info.value.code == "not_saved"


def test_patch_from_a_clean_run_over_every_layer():
    torch.manual_seed(0)
    model = ZOO_BY_NAME["residual_blocks"].make_model().eval()
    clean_x, corrupt_x = torch.randn(2, 3, 8, 8), torch.randn(2, 3, 8, 8)
    clean, corrupt = tl.trace(model, clean_x), tl.trace(model, corrupt_x)
    relus = [op.label for op in corrupt if op.func_name == "relu"]
    effects = []
    for label in relus:
        patched = corrupt.rerun(edits.patch(corrupt, clean, tl.label(label)))
        effects.append(float((patched.output - corrupt.output).norm()))
    assert len(effects) == len(relus) >= 2 and all(e > 0 for e in effects)
    last = corrupt.rerun(edits.patch(corrupt, clean, tl.label(relus[-1])))
    if corrupt[relus[-1]].children and all(
        corrupt[c].func_name != "add" for c in corrupt[relus[-1]].children
    ):
        torch.testing.assert_close(last.output, clean.output)


def test_patch_refuses_traces_that_are_not_comparable():
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    a, b = tl.trace(model, torch.randn(2, 4)), tl.trace(model, torch.randn(5, 4))
    with pytest.raises(InterventionError) as info:
        edits.patch(a, b, tl.label("relu_1"))
    assert info.value.code == "not_comparable" and "(2, 3)" in str(info.value)
    other = tl.trace(nn.Sequential(nn.Linear(4, 3), nn.Tanh()), torch.randn(2, 4))
    with pytest.raises(InterventionError) as info:
        edits.patch(a, other, tl.label("relu_1"))
    assert info.value.code == "not_comparable" and "'relu_1'" in str(info.value)


def test_a_recorded_call_that_no_longer_fits_the_edited_values_raises_a_typed_error():
    def forward(x):
        a = x * 1
        return a[a > 0].view(2, 2)  # four positive values when traced

    trace = tl.trace(forward, torch.tensor([1.0, 2.0, 3.0, 4.0]))
    with pytest.raises(InterventionError) as info:
        trace.rerun({tl.label("mul_1"): lambda t: t - 2.5})  # two of them stay positive
    assert info.value.code == "recompute_failed"
    assert "'view_1'" in str(info.value) and isinstance(info.value.__cause__, RuntimeError)


def _keeps_a_residual(x):
    h = x * 2
    residual = h
    y = h.to(torch.float32)  # float32 already: torch returns h itself
    return y.exp() + residual


def test_a_live_edit_of_an_op_that_returned_its_argument_leaves_the_argument_alone():
    x = torch.randn(3)
    edit = {tl.label("to_1"): lambda t: t * 1.5}
    live = tl.trace(_keeps_a_residual, x, intervene=edit)
    h = x * 2
    torch.testing.assert_close(live.output, (h * 1.5).exp() + h)  # as a forward hook does
    assert live["add_1"].parents == ("exp_1", "mul_1")  # the residual read h, not the edit
    assert tl.replay(_keeps_a_residual, (x,), intervene=edit).state == "passed"


def test_rerun_edits_an_op_that_returned_its_argument_for_all_its_readers_in_one_call():
    # one tensor under two names inside one call: the trace cannot tell them apart, and
    # rerun (as documented) gives the edit to both; a live run gives it to the returned one
    x = torch.randn(3)
    trace = tl.trace(_keeps_a_residual, x)
    assert trace["to_1"].meta["returns_argument"] == "mul_1"
    assert "returns_argument" not in trace["exp_1"].meta
    assert trace["add_1"].parents == ("exp_1", "to_1")
    what_if = trace.rerun({tl.label("to_1"): lambda t: t * 1.5})
    h = x * 2
    torch.testing.assert_close(what_if.output, (h * 1.5).exp() + h * 1.5)
    assert what_if.meta["intervened"] == ["to_1"]


def test_rerun_through_eval_dropout_equals_the_live_run():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.1), nn.Linear(4, 2)).eval()
    xa, xb = torch.randn(1, 4), torch.randn(1, 4)
    a, b = tl.trace(m, xa), tl.trace(m, xb)
    assert a["dropout_1"].meta["returns_argument"] == "linear_1"
    patch = edits.patch(a, b, tl.module("1").output)
    patched = a.rerun(patch)
    torch.testing.assert_close(patched.output, b.output, rtol=0, atol=0)
    torch.testing.assert_close(patched.output, tl.trace(m, xa, intervene=patch).output)
    assert patched.meta["intervened"] == ["dropout_1"]


class _Cast(nn.Module):
    """``RMSNorm``'s first step: ``x.to(float32)``, which returns a float32 ``x`` itself."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 3)

    def forward(self, x):
        return self.linear(x.to(torch.float32))


class _KeepsResidualOutside(nn.Module):
    """A residual kept by the caller before a submodule whose first op returns its
    argument: the residual holds the argument, the submodule the returned value."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = _Cast()

    def forward(self, x):
        residual = x * 1
        return self.norm(residual) + residual


def test_rerun_tells_a_residual_kept_outside_the_call_from_the_returned_value():
    torch.manual_seed(0)
    model, x = _KeepsResidualOutside(), torch.randn(2, 3)
    trace = tl.trace(model, x)
    (identity,) = [op for op in trace if "returns_argument" in op.meta]
    assert identity.module == "norm" and len(identity.children) == 2  # linear and add
    edit = {tl.label(identity.label): lambda t: t + 1.0}
    what_if = trace.rerun(edit)
    torch.testing.assert_close(what_if.output, tl.trace(model, x, intervene=edit).output)
    residual = x * 1  # the residual, kept outside the call, reads the argument
    expected = model.norm.linear(residual + 1.0) + residual
    torch.testing.assert_close(what_if.output, expected.detach())


class _EndsWith(nn.Module):
    """A block whose last op returns its argument as it was."""

    def __init__(self, last) -> None:
        super().__init__()
        self.linear, self.last = nn.Linear(3, 3), last

    def forward(self, x):
        return self.last(self.linear(x))


@pytest.mark.parametrize(
    "last",
    [
        lambda t: t.contiguous(),
        lambda t: t.to(torch.float32),
        lambda t: t.view_as(t).view(t.shape).contiguous(),
        nn.Identity(),
        nn.Dropout(0.5).eval(),
    ],
    ids=["contiguous", "to_same_dtype", "view_then_contiguous", "identity", "eval_dropout"],
)
def test_patching_a_block_that_ends_by_returning_its_argument_equals_the_live_run(last):
    torch.manual_seed(0)
    model = nn.Sequential(_EndsWith(last), nn.Linear(3, 2)).eval()
    xa, xb = torch.randn(2, 3), torch.randn(2, 3)
    a, b = tl.trace(model, xa), tl.trace(model, xb)
    patch = edits.patch(a, b, tl.module("0").output)
    patched = a.rerun(patch)
    torch.testing.assert_close(patched.output, b.output)
    torch.testing.assert_close(patched.output, tl.trace(model, xa, intervene=patch).output)
    scaled = {tl.module("0").output: edits.scale(3.0)}
    live = tl.trace(model, xa, intervene=scaled)
    torch.testing.assert_close(a.rerun(scaled).output, live.output)
