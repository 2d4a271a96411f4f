"""Patching with positions, patching sweeps and attribution patching (torchlens.edits)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens import edits
from torchlens.errors import GradUnavailableError, InterventionError, SelectorMatchError

from ._tiny_llms import bert_mlm as bert
from ._tiny_llms import gpt2_lm as gpt2
from ._tiny_llms import llama_lm as llama
from ._tiny_llms import prompts

BLOCKS = {
    "gpt2": (gpt2, "transformer.h.{}"),
    "llama": (llama, "model.layers.{}"),
    "bert": (bert, "bert.encoder.layer.{}"),
}


def _runs(name: str):
    build, pattern = BLOCKS[name]
    model = build()
    clean_ids, corrupt_ids = prompts()
    with torch.no_grad():
        clean, corrupt = tl.trace(model, clean_ids), tl.trace(model, corrupt_ids)
    sites = {f"block {i}": tl.module(pattern.format(i)).output for i in range(2)}
    return model, corrupt_ids, clean, corrupt, sites


def _live(model, ids, edit, metric) -> float:
    with torch.no_grad():
        return float(metric(tl.trace(model, ids, intervene=edit).output))


@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_patch_positions_equals_live_and_touches_only_those_positions(name):
    model, corrupt_ids, clean, corrupt, sites = _runs(name)
    site = sites["block 0"]
    edit = edits.patch(corrupt, clean, site, positions=[3, 5])
    rerun = corrupt.rerun(edit)
    with torch.no_grad():
        live = tl.trace(model, corrupt_ids, intervene=edit)
    torch.testing.assert_close(rerun.output.logits, live.output.logits)
    (patched,) = [op for op in rerun if site.matches(op)]
    want = corrupt[patched.label].out.clone()
    want[:, [3, 5]] = clean[patched.label].out[:, [3, 5]]
    assert torch.equal(patched.out, want)
    assert not torch.equal(patched.out, clean[patched.label].out)


@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_every_sweep_cell_equals_its_live_intervention(name):
    model, corrupt_ids, clean, corrupt, sites = _runs(name)
    metric = edits.logit_diff(3, 7, position=-1)
    result = edits.sweep(corrupt, clean, sites, metric, positions=[0, 3, -1])
    assert result.dims == ("site", "position")
    assert result.coords == {"site": ["block 0", "block 1"], "position": [0, 3, -1]}
    for s, site in enumerate(sites.values()):
        for p, pos in enumerate([0, 3, -1]):
            live = _live(model, corrupt_ids, edits.patch(corrupt, clean, site, positions=[pos]),
                         metric)  # fmt: skip
            assert result.values[s, p].item() == pytest.approx(live, abs=1e-5)
    assert result.meta["baseline"] == pytest.approx(float(metric(corrupt.output)))
    assert result.meta["source"] == pytest.approx(float(metric(clean.output)))
    if name != "bert":  # causal: patching before the changed token restores nothing
        assert result.values[0, 0].item() == pytest.approx(result.meta["baseline"], abs=1e-6)
    # the changed token's residual at the last block carries the whole difference for
    # the last position only through attention: the last position itself restores it all
    assert result.values[1, 2].item() == pytest.approx(result.meta["source"], abs=1e-5)


@pytest.mark.parametrize(
    ("name", "attn"),
    [("gpt2", "transformer.h.{}.attn"), ("llama", "model.layers.{}.self_attn"),
     ("bert", "bert.encoder.layer.{}.attention")],
)  # fmt: skip
def test_sweep_over_attention_outputs_equals_live(name, attn):
    # GPT-2's attention output is an eval Dropout's: an op that returns its argument
    model, corrupt_ids, clean, corrupt, _ = _runs(name)
    sites = {f"attn {i}": tl.module(attn.format(i)).output for i in range(2)}
    metric = edits.logit_diff(3, 7)
    result = edits.sweep(corrupt, clean, sites, metric, positions=[3, -1])
    for s, site in enumerate(sites.values()):
        for p, pos in enumerate([3, -1]):
            edit = edits.patch(corrupt, clean, site, positions=[pos])
            live = _live(model, corrupt_ids, edit, metric)
            assert result.values[s, p].item() == pytest.approx(live, abs=1e-5)
    assert len(set(result.values.flatten().tolist())) > 1


def test_sweep_over_heads_equals_live_on_gpt2_attention():
    model, corrupt_ids, clean, corrupt, _ = _runs("gpt2")
    sdpa = tl.func("scaled_dot_product_attention") & tl.module("transformer.h.1.*")
    metric = edits.logit_diff(3, 7)
    result = edits.sweep(corrupt, clean, {"attn 1": sdpa}, metric, positions=[-1], heads=[0, 1])
    assert result.dims == ("site", "position", "head") and tuple(result.shape) == (1, 1, 2)
    for h in (0, 1):
        edit = edits.patch(corrupt, clean, sdpa, positions=[-1], heads=[h])
        assert result.values[0, 0, h].item() == pytest.approx(
            _live(model, corrupt_ids, edit, metric), abs=1e-5
        )
    assert result.values[0, 0, 0] != result.values[0, 0, 1]


def test_sweep_result_exports_and_selects_by_label():
    pd = pytest.importorskip("pandas")
    _, _, clean, corrupt, sites = _runs("gpt2")
    result = edits.sweep(corrupt, clean, sites, edits.logit_diff(3, 7), positions=range(8))
    frame = result.to_pandas()
    assert isinstance(frame, pd.DataFrame) and list(frame.columns) == ["site", "position", "metric"]
    assert len(frame) == 16
    row = frame[(frame.site == "block 1") & (frame.position == 4)]
    assert row.metric.item() == pytest.approx(result.sel(site="block 1", position=4).item())
    heat = frame.pivot(index="site", columns="position", values="metric")
    assert heat.shape == (2, 8)
    with pytest.raises(tl.errors.InvalidArgumentError) as err:
        result.sel(site="block 9")
    assert err.value.code == "bad_labels"


def test_sweep_shows_a_progress_bar_when_asked(capsys):
    _, _, clean, corrupt, sites = _runs("gpt2")
    edits.sweep(corrupt, clean, sites, edits.logit_diff(3, 7), positions=[0, 1], progress=True)
    assert "tl.edits.sweep" in capsys.readouterr().err
    edits.sweep(corrupt, clean, sites, edits.logit_diff(3, 7), positions=[0, 1], progress=False)
    assert capsys.readouterr().err == ""


def test_sweep_errors_name_the_problem():
    model, _, clean, corrupt, sites = _runs("gpt2")
    with pytest.raises(SelectorMatchError) as err:
        edits.sweep(corrupt, clean, [tl.module("transformer.h.7").output], edits.logit_diff(3, 7))
    assert err.value.code == "no_match"
    with pytest.raises(InterventionError) as err:
        edits.sweep(corrupt, clean, sites, edits.logit_diff(3, 7), positions=[8])
    assert err.value.code == "bad_edit" and "positions=[8]" in str(err.value)
    with torch.no_grad():
        shorter = tl.trace(model, torch.zeros(1, 5, dtype=torch.long))
    with pytest.raises(InterventionError) as err:
        edits.sweep(corrupt, shorter, sites, edits.logit_diff(3, 7))
    assert err.value.code == "not_comparable"


# -- attribution patching -------------------------------------------------------------------
class _Circuit(nn.Module):
    """Four branches of different strengths, summed, then a mild nonlinearity."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.branches = nn.ModuleList(nn.Linear(8, 8) for _ in range(4))
        self.strength = (2.0, 1.0, 0.5, 0.1)
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        h = sum(s * b(x) for s, b in zip(self.strength, self.branches))
        return self.head(torch.tanh(0.3 * h))


def test_attribution_matches_the_formula_on_a_hand_built_case():
    model = _Circuit()
    x, y = torch.randn(1, 5, 8), torch.randn(1, 5, 8)
    corrupt, clean = tl.trace(model, x, save_grads=True), tl.trace(model, y)

    def metric(out):
        return out[0, -1, 0] - out[0, -1, 1]

    sites = {f"branch {i}": tl.module(f"branches.{i}").output for i in range(4)}
    result = edits.attribution(corrupt, clean, sites, metric, positions=range(5))
    # by hand: d metric / d branch_i = strength_i * 0.3 * (1 - tanh^2) * (w0 - w1)
    pre = 0.3 * sum(s * b(x) for s, b in zip(model.strength, model.branches))
    outer = (1 - torch.tanh(pre) ** 2) * 0.3 * (model.head.weight[0] - model.head.weight[1])
    outer[:, :-1] = 0  # the metric reads the last position only
    for i, branch in enumerate(model.branches):
        grad = model.strength[i] * outer
        want = ((branch(y) - branch(x)) * grad).sum(-1)[0]
        torch.testing.assert_close(result.values[i], want.detach().double())
    assert result.dims == ("site", "position")
    assert result.meta["baseline"] == pytest.approx(float(metric(model(x)).detach()))
    assert torch.all(result.values[:, :-1] == 0)


def test_attribution_ranks_sites_like_the_full_sweep():
    model = _Circuit()
    x, y = torch.randn(1, 5, 8), torch.randn(1, 5, 8)
    metric = edits.logit_diff(0, 1)
    sites = {f"branch {i}": tl.module(f"branches.{i}").output for i in range(4)}
    estimate = edits.attribution(tl.trace(model, x, save_grads=True), tl.trace(model, y), sites,
                                 metric)  # fmt: skip
    with torch.no_grad():
        corrupt, clean = tl.trace(model, x), tl.trace(model, y)
    full = edits.sweep(corrupt, clean, sites, metric)
    effect = full.values - full.meta["baseline"]
    assert torch.argsort(estimate.values.abs()).tolist() == torch.argsort(effect.abs()).tolist()
    assert torch.sign(estimate.values).tolist() == torch.sign(effect).tolist()


ATTENTION = {
    "gpt2": "transformer.h.{}.attn",
    "llama": "model.layers.{}.self_attn",
    "bert": "bert.encoder.layer.{}.attention",
}


@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_attribution_tracks_the_sweep_on_llms(name):
    model, corrupt_ids, clean, _, sites = _runs(name)
    sites.update({f"attn {i}": tl.module(ATTENTION[name].format(i)).output for i in range(2)})
    metric = edits.logit_diff(3, 7)
    corrupt = tl.trace(model, corrupt_ids, save_grads=True)
    estimate = edits.attribution(corrupt, clean, sites, metric, positions=range(8))
    full = edits.sweep(corrupt, clean, sites, metric, positions=range(8))
    effect = (full.values - full.meta["baseline"]).flatten()
    flat = estimate.values.flatten()
    assert torch.corrcoef(torch.stack([flat, effect]))[0, 1] > 0.9
    if name != "bert":  # causal: the same top cell, and no effect before the changed token
        assert int(flat.abs().argmax()) == int(effect.abs().argmax())
        assert torch.all(estimate.values[:, :3] == 0)
    # (BERT's attention output is normed after its residual: patching it at the changed
    # token moves the metric 40% less than the first-order estimate says; the gradient
    # itself is right, as a patch of 0.001 of the difference shows)


def test_attribution_per_position_and_head_sums_the_right_axes():
    model, corrupt_ids, clean, _, _ = _runs("gpt2")
    corrupt = tl.trace(model, corrupt_ids, save_grads=True)
    sdpa = tl.func("scaled_dot_product_attention")  # two ops: one per layer, summed
    metric = edits.logit_diff(3, 7)
    got = edits.attribution(corrupt, clean, {"attn": sdpa}, metric, positions=[3, -1], heads=[0, 1])
    assert got.dims == ("site", "position", "head") and tuple(got.shape) == (1, 2, 2)
    want = torch.zeros(2, 2, dtype=torch.float64)
    for op in corrupt:
        if op.func_name == "scaled_dot_product_attention":  # (batch, heads, tokens, head_dim)
            c = (clean[op.label].out - op.out).double() * op.grad.double()
            want += c.sum(dim=(0, 3))[:, [3, -1]].T
    torch.testing.assert_close(got.values[0], want)
    assert torch.all(want != 0)


def test_attribution_after_a_backward_and_its_errors():
    model = _Circuit()
    x, y = torch.randn(1, 5, 8), torch.randn(1, 5, 8)
    sites = [tl.module("branches.0").output]
    clean = tl.trace(model, y)
    corrupt = tl.trace(model, x, save_grads=True)
    with pytest.raises(GradUnavailableError) as err:
        edits.attribution(corrupt, clean, sites)
    assert err.value.code == "backward_not_run" and "metric=" in str(err.value)
    corrupt.backward(edits.logit_diff(0, 1))
    after = edits.attribution(corrupt, clean, sites)
    fresh = edits.attribution(tl.trace(model, x, save_grads=True), clean, sites,
                              edits.logit_diff(0, 1))  # fmt: skip
    torch.testing.assert_close(after.values, fresh.values)
    with pytest.raises(GradUnavailableError) as err:
        edits.attribution(clean, corrupt, sites, edits.logit_diff(0, 1))
    assert err.value.code == "grads_not_captured"
    with pytest.raises(InterventionError) as err:
        edits.attribution(corrupt, clean, sites, positions=[0], heads=[0], head_dim=1, seq_dim=1)
    assert err.value.code == "bad_edit"


def test_labelled_tensor_checks_its_labels():
    values = torch.arange(6.0).view(2, 3)
    t = edits.LabelledTensor(
        values, ("site", "position"), {"site": ["a", "b"], "position": [0, 1, 2]}
    )
    assert t.to_dicts()[4] == {"site": "b", "position": 1, "value": 4.0}
    assert torch.equal(t.sel(position=2), torch.tensor([2.0, 5.0]))
    assert repr(t) == "<LabelledTensor value: site=2, position=3>"
    with pytest.raises(tl.errors.InvalidArgumentError) as err:
        edits.LabelledTensor(values, ("site",), {"site": ["a", "b"]})
    assert err.value.code == "bad_labels"
    with pytest.raises(tl.errors.InvalidArgumentError) as err:
        edits.LabelledTensor(values, ("site", "position"), {"site": ["a"], "position": [0, 1, 2]})
    assert err.value.code == "bad_labels"


@pytest.mark.parametrize("name", ["bert", "gpt2"])  # (Llama's RMSNorm runs in float32)
def test_attribution_is_the_derivative_of_a_live_patch(name):
    model = BLOCKS[name][0]().double()  # float64, for a finite difference
    clean_ids, corrupt_ids = prompts()
    clean = tl.trace(model, clean_ids)
    site = tl.module(ATTENTION[name].format(0)).output
    metric = edits.logit_diff(3, 7)
    corrupt = tl.trace(model, corrupt_ids, save_grads=True)
    got = edits.attribution(corrupt, clean, [site], metric, positions=[3]).values[0, 0].item()
    (op,) = [op for op in corrupt if site.matches(op)]
    step = torch.zeros_like(op.out)
    step[:, 3] = 1e-4 * (clean[op.label].out - op.out)[:, 3].detach()

    def patched(sign: float) -> float:
        edit = {site: lambda t, op: t + sign * step}
        with torch.no_grad():
            return metric(tl.trace(model, corrupt_ids, intervene=edit).output).item()

    slope = (patched(1.0) - patched(-1.0)) / 2e-4  # central difference
    assert got == pytest.approx(slope, rel=1e-5)


def test_positions_and_heads_may_be_generators():
    _, _, clean, corrupt, sites = _runs("gpt2")
    metric = edits.logit_diff(3, 7)
    listed = edits.sweep(corrupt, clean, sites, metric, positions=[0, 3])
    generated = edits.sweep(corrupt, clean, sites, metric, positions=(p for p in (0, 3)))
    assert generated.coords == listed.coords and torch.equal(generated.values, listed.values)
