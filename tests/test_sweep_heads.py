"""Sweeps refuse what they cannot mean: ``heads=`` on a site whose head axis is its
position axis; per-head patching of ``(batch, tokens, d)`` sites by ``n_heads=``; a mean
over a batch of one."""

from __future__ import annotations

import pytest
import torch

import torchlens as tl
from torchlens import edits
from torchlens.errors import InterventionError

from ._tiny_llms import gpt2_lm, prompts


def _runs(save_grads: bool = False):
    model = gpt2_lm()
    clean_ids, corrupt_ids = prompts()
    with torch.no_grad():
        clean = tl.trace(model, clean_ids)
    corrupt = tl.trace(model, corrupt_ids, save_grads=save_grads)
    return model, corrupt_ids, clean, corrupt


def test_heads_on_the_position_axis_are_refused():
    _, _, clean, corrupt = _runs()
    block = tl.module("transformer.h.1").output  # (batch, tokens, d): no head axis
    metric = edits.logit_diff(3, 7)
    with pytest.raises(InterventionError) as info:
        edits.sweep(corrupt, clean, {"block": block}, metric, heads=[0, 1])
    assert info.value.code == "bad_edit" and "n_heads=" in str(info.value)
    with pytest.raises(InterventionError) as info:
        corrupt.rerun(edits.patch(corrupt, clean, block, heads=[0]))
    assert info.value.code == "bad_edit" and "same axis" in str(info.value)
    traced = tl.trace(gpt2_lm(), prompts()[1], save_grads=True)
    with pytest.raises(InterventionError) as info:
        edits.attribution(traced, clean, {"block": block}, metric, heads=[0, 1])
    assert info.value.code == "bad_edit"


def _z_site(trace) -> str:
    """The attention output projection's input of layer 1: (batch, tokens, heads * d_head)."""
    (z,) = trace.module_calls("transformer.h.1.attn.c_proj")[0].inputs
    return z


def test_per_head_patching_of_a_tokens_by_d_site_splits_d():
    model, corrupt_ids, clean, corrupt = _runs()
    z = tl.label(_z_site(corrupt))
    sdpa = tl.func("scaled_dot_product_attention") & tl.module("transformer.h.1.*")
    metric = edits.logit_diff(3, 7)
    by_z = edits.sweep(corrupt, clean, {"z": z}, metric, positions=[3, -1], heads=[0, 1],
                       n_heads=2)  # fmt: skip
    by_sdpa = edits.sweep(corrupt, clean, {"z": sdpa}, metric, positions=[3, -1], heads=[0, 1])
    torch.testing.assert_close(by_z.values, by_sdpa.values, atol=1e-6, rtol=1e-6)
    assert by_z.values[0, 1, 0] != by_z.values[0, 1, 1]
    # one head patched: only its slice of d changes
    patched = corrupt.rerun(edits.patch(corrupt, clean, z, heads=[1], n_heads=2))
    label = _z_site(corrupt)
    want = corrupt[label].out.clone()
    want[..., 16:] = clean[label].out[..., 16:]
    assert torch.equal(patched[label].out, want)
    with torch.no_grad():
        live = tl.trace(model, corrupt_ids,
                        intervene=edits.patch(corrupt, clean, z, heads=[1], n_heads=2))  # fmt: skip
    torch.testing.assert_close(live.output.logits, patched.output.logits)
    with pytest.raises(InterventionError) as info:
        corrupt.rerun(edits.patch(corrupt, clean, z, heads=[1], n_heads=3))
    assert info.value.code == "bad_edit" and "n_heads=3" in str(info.value)


def test_attribution_per_head_of_a_split_site_sums_its_slices():
    _, _, clean, corrupt = _runs(save_grads=True)
    label = _z_site(corrupt)
    metric = edits.logit_diff(3, 7)
    got = edits.attribution(corrupt, clean, {"z": tl.label(label)}, metric, positions=[-1],
                            heads=[0, 1], n_heads=2)  # fmt: skip
    c = (clean[label].out - corrupt[label].out).double() * corrupt[label].grad.double()
    want = c[0, -1].view(2, 16).sum(-1)
    torch.testing.assert_close(got.values[0, 0], want)


def test_mean_over_a_batch_of_one_is_refused():
    x = torch.randn(1, 5, 8)
    with pytest.raises(InterventionError) as info:
        edits.mean()(x, _Op())
    assert info.value.code == "bad_edit" and "value=" in str(info.value)
    # what to average over, said: the tokens, or a precomputed mean
    torch.testing.assert_close(edits.mean(dim=1)(x, _Op()), x.mean(1, keepdim=True).expand_as(x))
    torch.testing.assert_close(edits.mean(value=torch.ones(8))(x, _Op()), torch.ones(1, 5, 8))
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    with pytest.raises(InterventionError):
        tl.trace(model, x, intervene={tl.func("relu"): edits.mean()})


class _Op:
    label, shape = "relu_1", (1, 5, 8)
