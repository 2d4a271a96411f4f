"""``tl.llm_sites`` against the TransformerLens library itself, on the same weights.

``tests/test_llm_sites.py`` checks every family against TransformerLens's definitions
written as forward hooks; this file runs TransformerLens (4.x, its ``TransformerBridge``
over the very same Hugging Face model, attention forced to eager as TransformerLens does)
and compares its activation cache hook by hook. Skipped where ``transformer_lens`` is not
installed (it is in the ``test`` extra).
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

import torchlens as tl

from . import _tiny_llms as tiny

SITES = ["resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "q", "k", "v", "z",
         "pattern"]  # fmt: skip


def _bridge(name: str, model):
    """TransformerLens's bridge over a copy of ``model`` (a word-level tokenizer stands in
    for the hub's, which this machine cannot download; the ids are given directly)."""
    bridge_cls = pytest.importorskip("transformer_lens.model_bridge").TransformerBridge
    tokenizers = pytest.importorskip("tokenizers")
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(model.config.vocab_size)}
    words = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="t0"))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, unk_token="t0",
                                        pad_token="t0", eos_token="t0")  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return bridge_cls.boot_transformers(name, hf_model=copy.deepcopy(model),
                                            tokenizer=tokenizer)  # fmt: skip


def _hook_name(cache_keys: set[str], site: str, layer: int) -> str:
    """TransformerLens's hook for ``site``: ``hook_rot_q``/``hook_rot_k`` on rotary models
    (what attention reads), else ``attn.hook_<site>`` or ``hook_<site>``."""
    names = [f"blocks.{layer}.attn.hook_rot_{site}"] if site in ("q", "k") else []
    names += [f"blocks.{layer}.attn.hook_{site}", f"blocks.{layer}.hook_{site}"]
    return next(name for name in names if name in cache_keys)


@pytest.mark.parametrize(
    "name, build", [("gpt2", tiny.gpt2_lm), ("meta-llama/Llama-3.2-1B", tiny.llama_lm)],
    ids=["gpt2", "llama"],
)  # fmt: skip
def test_every_site_equals_transformer_lens_on_the_same_weights(name, build):
    torch.manual_seed(0)
    model = build().eval()
    bridge = _bridge(name, model)
    ids = tiny.ids(5, n=7)
    _, cache = bridge.run_with_cache(ids)
    keys = set(cache.keys())
    sites = tl.llm_sites(model)
    trace = tl.trace(model, ids)
    for layer in range(sites.n_layers):
        for site in SITES:
            selector = getattr(sites, site)(layer)
            (op,) = [op for op in trace if selector.matches(op)]
            got = tl.attention_pattern(op) if site == "pattern" else op.out
            want = cache[_hook_name(keys, site, layer)]
            if site in ("q", "k", "v", "z"):  # TransformerLens: (batch, pos, heads, d_head)
                want = want.transpose(1, 2)
            torch.testing.assert_close(got, want, msg=f"{site} {layer}")
