"""TransformerLens-named sites (``tl.llm_sites``) against TransformerLens's definitions,
computed by hand-written hook code on the same weights (GPT-2 and Llama-family models).

``transformer_lens`` itself is not installed (it pulls wandb, datasets, pyarrow, ...): each
reference below is its hook's definition written out (HookedTransformer's attention is
``softmax(q k^T / sqrt(d_head) + causal mask) v``, with rotary applied to q and k first)."""

from __future__ import annotations

import math

import pytest
import torch

import torchlens as tl
from torchlens import edits
from torchlens.attention import attention_inputs
from torchlens.errors import InvalidArgumentError, UnsupportedModelError

from . import _tiny_llms as tiny

NAMES = ["resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "q", "k", "v", "z"]


# per family, below each block: (attention, the LayerNorm resid_mid feeds or None, the
# LayerNorm resid_post feeds or None for the block output, attn_out's module, mlp_out's module)
_LAYOUT = {
    "gpt2": ("attn", "ln_2", None, "attn", "mlp"),
    "llama": ("self_attn", "post_attention_layernorm", None, "self_attn", "mlp"),
    "gpt_neox": ("attention", "post_attention_layernorm", None, "attention", "mlp"),
    "phi": ("self_attn", None, None, "self_attn", "mlp"),
    "opt": ("self_attn", "final_layer_norm", None, "self_attn", "fc2"),
    "bert": ("attention.self", "attention.output.LayerNorm", "output.LayerNorm",
             "attention.output.dense", "output.dense"),
}  # fmt: skip


def _blocks(model):
    kind = model.config.model_type
    if kind == "gpt2":
        return model.transformer, model.transformer.h
    if kind == "gpt_neox":
        return model.gpt_neox, model.gpt_neox.layers
    if kind == "opt":
        return model.model.decoder, model.model.decoder.layers
    if kind == "bert":
        base = getattr(model, "bert", model)
        return base, base.encoder.layer
    return model.model, model.model.layers


def _rotate(x, cos, sin):
    """Rotary on the first ``cos.shape[-1]`` features of each head (all of them, or part)."""
    r = cos.shape[-1]
    x, rest = x[..., :r], x[..., r:]
    rotated = torch.cat((-x[..., r // 2 :], x[..., : r // 2]), dim=-1)
    return torch.cat((x * cos + rotated * sin, rest), dim=-1)


def _first(args, kwargs):
    return (args or (kwargs["hidden_states"],))[0]


def _qkv(model, attn, x, n):
    config = model.config
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    d_head = config.hidden_size // heads
    kind = config.model_type
    if kind == "gpt2":
        q, k, v = attn.c_attn(x).split(config.hidden_size, dim=-1)
    elif kind == "gpt_neox":  # per head [q | k | v]
        qkv = attn.query_key_value(x).view(1, n, heads, 3 * d_head).transpose(1, 2)
        return (*qkv.chunk(3, dim=-1), d_head)
    elif kind == "bert":
        q, k, v = attn.query(x), attn.key(x), attn.value(x)
    else:
        q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
    q = q.view(1, n, heads, d_head).transpose(1, 2)
    k = k.view(1, n, kv_heads, d_head).transpose(1, 2)
    v = v.view(1, n, kv_heads, d_head).transpose(1, 2)
    return q, k, v, d_head


def _reference(model, ids) -> dict[tuple[str, int], torch.Tensor]:
    """Every site of every layer by forward hooks and TransformerLens's definitions, in the
    model's layout (q/k/v/z: (batch, heads, pos, d_head))."""
    kind = model.config.model_type
    base, blocks = _blocks(model)
    attn_name, mid_name, post_name, attn_out_name, mlp_name = _LAYOUT.get(kind, _LAYOUT["llama"])
    got, handles, n = {}, [], ids.shape[1]

    def keep(key, value):
        got[key] = value.detach().clone()

    def out0(out):
        return out[0] if isinstance(out, tuple) else out

    for layer, block in enumerate(blocks):
        part = block.get_submodule
        handles += [
            block.register_forward_pre_hook(
                lambda m, a, kw, L=layer: keep(("resid_pre", L), _first(a, kw)), with_kwargs=True),
            part(attn_name).register_forward_pre_hook(
                lambda m, a, kw, L=layer: keep(("x", L), _first(a, kw)), with_kwargs=True),
            part(attn_out_name).register_forward_hook(
                lambda m, a, out, L=layer: keep(("attn_out", L), out0(out))),
            part(mlp_name).register_forward_hook(
                lambda m, a, out, L=layer: keep(("mlp_out", L), out)),
        ]  # fmt: skip
        if mid_name is not None:  # OPT flattens (batch, pos) before its MLP's LayerNorm
            handles.append(part(mid_name).register_forward_pre_hook(
                lambda m, a, L=layer: keep(("resid_mid", L), a[0].view(1, n, -1))))  # fmt: skip
        if post_name is None:
            handles.append(block.register_forward_hook(
                lambda m, a, out, L=layer: keep(("resid_post", L), out0(out))))  # fmt: skip
        else:  # BERT: TransformerLens's resid_post is before the block's last LayerNorm
            handles.append(part(post_name).register_forward_pre_hook(
                lambda m, a, L=layer: keep(("resid_post", L), a[0])))  # fmt: skip
    try:
        with torch.no_grad():
            model(ids)
    finally:
        for h in handles:
            h.remove()
    for layer, block in enumerate(blocks):
        attn, x = block.get_submodule(attn_name), got["x", layer]
        with torch.no_grad():
            q, k, v, d_head = _qkv(model, attn, x, n)
            if kind not in ("gpt2", "opt", "bert"):  # rotary: TransformerLens's hook_rot_q/k
                cos, sin = base.rotary_emb(x, torch.arange(n)[None])
                q = _rotate(q, cos[:, None], sin[:, None])
                k = _rotate(k, cos[:, None], sin[:, None])
            repeat = q.shape[1] // k.shape[1]
            scores = q @ k.repeat_interleave(repeat, 1).transpose(-1, -2) / math.sqrt(d_head)
            if kind != "bert":  # an encoder attends both ways
                scores = scores.masked_fill(torch.ones(n, n).triu(1).bool(), float("-inf"))
            pattern = scores.softmax(-1)
        got["q", layer], got["k", layer], got["v", layer] = q, k, v
        got["pattern", layer] = pattern
        got["z", layer] = pattern @ v.repeat_interleave(repeat, 1)
    return got


def _qwen2():
    return tiny.build("Qwen2ForCausalLM", "Qwen2Config", frozen=True, **tiny._LLAMA_LIKE)


def _mistral():
    return tiny.mistral(sliding_window=64)


def _bert_mlm():
    return tiny.bert_mlm().requires_grad_(False)


FAMILY_BUILDERS = {
    "gpt2": tiny.gpt2_lm, "llama": tiny.llama_lm, "gpt2-4-heads": tiny.gpt2,
    "mistral": _mistral, "qwen2": _qwen2, "gemma": tiny.gemma, "gpt-neox": tiny.gpt_neox,
    "gpt-neox-sequential": lambda: tiny.gpt_neox(parallel=False), "phi": tiny.phi,
    "opt": tiny.opt, "bert": tiny.bert, "bert-mlm": _bert_mlm,
}  # fmt: skip
# sites a family has no exact op for: a typed error, never another op
NOT_EXACT = {"gpt-neox": {"resid_mid"}, "phi": {"resid_mid"}, "opt": {"q", "mlp_out"}}


@pytest.mark.parametrize("family", list(FAMILY_BUILDERS))
def test_each_site_equals_transformer_lens_definition(family):
    model = FAMILY_BUILDERS[family]()
    ids = tiny.ids(5, n=7)
    want = _reference(model, ids)
    sites = tl.llm_sites(model)
    every, labels = None, set()
    for name in NAMES:
        if name in NOT_EXACT.get(family, ()):
            with pytest.raises(UnsupportedModelError) as info:
                getattr(sites, name)(0)
            assert info.value.code == "unsupported_site" and name in str(info.value)
            continue
        for layer in range(sites.n_layers):
            sel = getattr(sites, name)(layer)
            every = sel if every is None else every | sel
            rec = tl.record(model, ids, save=sel)
            assert len(rec.labels) == 1, (name, layer, rec.labels)
            labels.add(rec.labels[0])
            torch.testing.assert_close(rec[rec.labels[0]].out, want[name, layer],
                                       msg=f"{name} {layer}")  # fmt: skip
            (op,) = [op for op in tl.trace(model, ids, save=sel) if sel.matches(op)]
            torch.testing.assert_close(op.out, want[name, layer])
    assert set(tl.record(model, ids, save=every).labels) == labels  # all at once, the same
    trace = tl.trace(model, ids)  # the pattern is rebuilt from the q and k attention read
    for layer in range(sites.n_layers):
        (op,) = [op for op in trace if sites.pattern(layer).matches(op)]
        torch.testing.assert_close(tl.attention_pattern(op), want["pattern", layer])


def test_transformer_lens_hook_names_and_layers():
    model = tiny.gpt2_lm()
    sites = tl.llm_sites(model)
    ids = tiny.ids(2, n=5)
    want = _reference(model, ids)
    for name, key in [("blocks.1.hook_resid_pre", ("resid_pre", 1)),
                      ("blocks.0.attn.hook_z", ("z", 0)),
                      ("blocks.1.attn.hook_rot_q", ("q", 1)),
                      ("blocks.0.hook_mlp_out", ("mlp_out", 0))]:  # fmt: skip
        rec = tl.record(model, ids, save=sites[name])
        torch.testing.assert_close(rec[rec.labels[0]].out, want[key])
    assert repr(sites.resid_pre(-1)) == repr(sites.resid_post(0))
    for bad in ("blocks.0.hook_nope", "blocks.0.attn.hook_resid_pre", 3):
        with pytest.raises(InvalidArgumentError):
            sites[bad]
    with pytest.raises(InvalidArgumentError) as info:
        sites.resid_post(2)
    assert info.value.code == "bad_selector" and "0..1" in str(info.value)


def test_a_base_model_without_a_head():
    model = tiny.gpt2_lm().transformer
    rec = tl.record(model, tiny.ids(1), save=tl.llm_sites(model).attn_out(1))
    assert rec[rec.labels[0]].module == "h.1.attn.resid_dropout"


@pytest.mark.parametrize(
    ("build", "base", "want"),
    [(tiny.gpt_neox, "gpt_neox", "layers.1.attention.dense"),
     (tiny.opt, "model", "decoder.layers.1.self_attn.out_proj"),
     (tiny.phi, "model", "layers.1.self_attn.dense")],
)  # fmt: skip
def test_base_models_of_the_other_families(build, base, want):
    full = build()
    model = getattr(full, base)
    ids = tiny.ids(3, n=5)
    sites = tl.llm_sites(model)
    rec = tl.record(model, ids, save=sites.attn_out(1) | sites.resid_pre(0) | sites.k(1))
    assert len(rec.labels) == 3 and rec[rec.labels[-1]].module == want
    ref = _reference(full, ids)
    got = {rec[lab].module: rec[lab].out for lab in rec.labels}
    torch.testing.assert_close(got[want], ref["attn_out", 1])
    torch.testing.assert_close(rec[rec.labels[0]].out, ref["resid_pre", 0])


def test_missing_sites_by_hook_name_are_typed_errors():
    for build, name in [(tiny.opt, "blocks.0.attn.hook_q"), (tiny.opt, "blocks.1.attn.hook_rot_q"),
                        (tiny.phi, "blocks.1.hook_resid_mid"),
                        (tiny.gpt_neox, "blocks.0.hook_resid_mid")]:  # fmt: skip
        with pytest.raises(UnsupportedModelError) as info:
            tl.llm_sites(build())[name]
        assert info.value.code == "unsupported_site", name
    sites = tl.llm_sites(tiny.gpt_neox(parallel=False))
    assert repr(sites["blocks.0.hook_resid_mid"]) == repr(sites.resid_mid(0))


def test_other_families_get_a_typed_error_naming_the_supported_ones():
    # Gemma2: eager attention with logit soft-capping and a LayerNorm after attention and MLP
    gemma2 = tiny.build("Gemma2ForCausalLM", "Gemma2Config", head_dim=8, **tiny._LLAMA_LIKE)
    with pytest.raises(UnsupportedModelError) as info:
        tl.llm_sites(gemma2)
    assert info.value.code == "unsupported_family"
    message = str(info.value)
    for name in ("gpt2", "gpt_neox", "llama", "mistral", "qwen2", "gemma", "bert", "opt", "phi"):
        assert f"'{name}'" in message, name
    assert "'gemma2'" in message and "Gemma2ForCausalLM" in message
    post_ln_opt = tiny.build("OPTForCausalLM", "OPTConfig", num_hidden_layers=1, hidden_size=32,
                             num_attention_heads=4, ffn_dim=64, do_layer_norm_before=False,
                             **tiny._DECODER)  # fmt: skip
    with pytest.raises(UnsupportedModelError) as info:
        tl.llm_sites(post_ln_opt)
    assert info.value.code == "unsupported_family" and "do_layer_norm_before" in str(info.value)
    with pytest.raises(UnsupportedModelError) as info:
        tl.llm_sites(torch.nn.Linear(2, 2))
    assert info.value.code == "unsupported_family"


def test_sites_work_in_intervene_sweep_and_extract(tmp_path):
    model = tiny.gpt2_lm()
    sites = tl.llm_sites(model)
    clean_ids, corrupt_ids = tiny.prompts()
    clean, corrupt = tl.trace(model, clean_ids), tl.trace(model, corrupt_ids)
    metric = edits.logit_diff(3, 7)
    grid = edits.sweep(corrupt, clean, {f"resid_pre {L}": sites.resid_pre(L) for L in range(2)},
                       metric, positions=[3, -1])  # fmt: skip
    assert tuple(grid.shape) == (2, 2)
    for L in range(2):
        live = tl.trace(
            model,
            corrupt_ids,
            intervene=edits.patch(corrupt, clean, sites.resid_pre(L), positions=[3]),
        )
        want = float(metric(live.output).detach())
        assert float(grid.values[L, 0]) == pytest.approx(want, abs=1e-5)
    zeroed = tl.trace(model, clean_ids, intervene={sites.q(1): edits.zero()})
    assert not torch.allclose(zeroed.output.logits, clean.output.logits)
    data = [tiny.ids(s, n=5) for s in range(3)]
    ex = tl.extract(model, data, save=sites.resid_mid(1), to=tmp_path / "r", progress=False)
    want = torch.cat([_reference(model, x)["resid_mid", 1] for x in data])
    torch.testing.assert_close(torch.as_tensor(ex[list(ex)[0]][:]), want)


@pytest.mark.parametrize("family", ["gpt-neox", "phi", "opt", "bert-mlm", "gemma"])
def test_other_families_sites_in_sweep_and_intervene(family):
    model = FAMILY_BUILDERS[family]()
    sites = tl.llm_sites(model)
    clean_ids, corrupt_ids = tiny.prompts()
    clean, corrupt = tl.trace(model, clean_ids), tl.trace(model, corrupt_ids)
    metric = edits.logit_diff(3, 7)
    chosen = {"attn_out 0": sites.attn_out(0), "resid_post 0": sites.resid_post(0),
              "z 0": sites.z(0)}  # fmt: skip
    grid = edits.sweep(corrupt, clean, chosen, metric, positions=[3])
    for s, site in enumerate(chosen.values()):  # -2 is the position axis of each
        edit = edits.patch(corrupt, clean, site, positions=[3])
        live = tl.trace(model, corrupt_ids, intervene=edit)
        assert float(grid.values[s, 0]) == pytest.approx(float(metric(live.output)), abs=1e-5)
    unpatched = float(metric(corrupt.output))
    assert any(abs(float(g) - unpatched) > 1e-6 for g in grid.values.flatten())
    zeroed = tl.trace(model, clean_ids, intervene={sites.k(1): edits.zero(heads=[1])})
    assert not torch.allclose(zeroed.output.logits, clean.output.logits)


def test_a_sweep_over_attention_pattern_patching():
    model = tiny.gpt2_lm()
    sites = tl.llm_sites(model)
    clean_ids, corrupt_ids = tiny.prompts()
    clean, corrupt = tl.trace(model, clean_ids), tl.trace(model, corrupt_ids)
    metric = edits.logit_diff(3, 7)
    patterns = {f"pattern {L}": sites.pattern(L) for L in range(2)}
    grid = edits.sweep(corrupt, clean, patterns, metric, positions=[3, -1], heads=[0, 1],
                       patch="pattern")  # fmt: skip
    assert grid.dims == ("site", "position", "head") and tuple(grid.shape) == (2, 2, 2)
    for s, site in enumerate(patterns.values()):
        for p, pos in enumerate([3, -1]):
            for h in (0, 1):
                edit = {site: edits.patch_pattern(clean, heads=[h], positions=[pos])}
                live = tl.trace(model, corrupt_ids, intervene=edit)
                want = float(metric(live.output).detach())
                assert float(grid.values[s, p, h]) == pytest.approx(want, abs=1e-5)
    assert len(set(grid.values.flatten().tolist())) > 1
    # the whole pattern of layer 1: z = the clean pattern applied to the corrupt values
    patched = corrupt.rerun({sites.pattern(1): edits.patch_pattern(clean)})
    (op,) = [op for op in patched if sites.z(1).matches(op)]
    (was,) = [op for op in clean if sites.z(1).matches(op)]
    (corrupt_op,) = [op for op in corrupt if sites.z(1).matches(op)]
    v = attention_inputs(corrupt_op).value
    torch.testing.assert_close(op.out, tl.attention_pattern(was) @ v)
    with pytest.raises(InvalidArgumentError):
        edits.sweep(corrupt, clean, patterns, metric, patch="values")


def test_counted_sites_combine_in_any_order():
    model = tiny.gpt2_lm()
    sites = tl.llm_sites(model)
    ids = tiny.ids(4, n=6)
    want = _reference(model, ids)
    for combined in (sites.k(0) | sites.q(0), sites.q(0) | sites.k(0),
                     (sites.k(0) | sites.v(0)) | sites.q(0)):  # fmt: skip
        rec = tl.record(model, ids, save=combined)
        values = {round(float(rec[lab].out.sum()), 4) for lab in rec.labels}
        assert {round(float(want[n, 0].sum()), 4) for n in ("q", "k")} <= values
        assert len(rec.labels) in (2, 3)
