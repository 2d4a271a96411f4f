"""Tiny transformers language models built from configs (random weights, no download).

Two families of builders share one constructor: ``gpt2``/``bert``/``llama``/``mistral`` take
the attention implementation (the attention and rerun tests compare SDPA with eager), and
``gpt2_lm``/``llama_lm``/``bert_mlm`` take the layer count and vocabulary (the sweep and
lens tests need a language-model head and grads)."""

from __future__ import annotations

import pytest
import torch

VOCAB = 100


def _transformers():
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    return transformers


def build(model_class: str, config_class: str, *, frozen: bool = False, **config):
    """``model_class`` from ``config_class(**config)``, seeded, in eval mode."""
    tf = _transformers()
    config = getattr(tf, config_class)(**config)
    torch.manual_seed(0)
    model = getattr(tf, model_class)(config).eval()
    return model.requires_grad_(False) if frozen else model


_DECODER = dict(vocab_size=VOCAB, max_position_embeddings=64, bos_token_id=0, eos_token_id=0)
_LLAMA_LIKE = dict(
    num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
    intermediate_size=64, **_DECODER,
)  # fmt: skip


def gpt2(attn: str = "sdpa"):
    return build(
        "GPT2LMHeadModel", "GPT2Config", frozen=True, n_layer=2, n_embd=32, n_head=4,
        vocab_size=VOCAB, n_positions=64, bos_token_id=0, eos_token_id=0, attn_implementation=attn,
    )  # fmt: skip


def bert(attn: str = "sdpa"):
    return build(
        "BertModel", "BertConfig", frozen=True, num_hidden_layers=2, hidden_size=32,
        num_attention_heads=4, intermediate_size=64, vocab_size=VOCAB, max_position_embeddings=64,
        attn_implementation=attn,
    )  # fmt: skip


def llama(attn: str = "sdpa"):
    return build(
        "LlamaForCausalLM", "LlamaConfig", frozen=True, **_LLAMA_LIKE, attn_implementation=attn
    )


def mistral(attn: str = "sdpa", sliding_window: int = 3):
    return build(
        "MistralForCausalLM", "MistralConfig", frozen=True, **_LLAMA_LIKE,
        sliding_window=sliding_window, attn_implementation=attn,
    )  # fmt: skip


def gpt_neox(parallel: bool = True):
    """Partial rotary (a quarter of each head) and a fused query/key/value projection."""
    return build(
        "GPTNeoXForCausalLM", "GPTNeoXConfig", frozen=True, num_hidden_layers=2, hidden_size=32,
        num_attention_heads=4, intermediate_size=64, use_parallel_residual=parallel, **_DECODER,
    )  # fmt: skip


def gemma():
    return build("GemmaForCausalLM", "GemmaConfig", frozen=True, head_dim=8, **_LLAMA_LIKE)


def opt():
    return build(
        "OPTForCausalLM", "OPTConfig", frozen=True, num_hidden_layers=2, hidden_size=32,
        num_attention_heads=4, ffn_dim=64, word_embed_proj_dim=32, **_DECODER,
    )  # fmt: skip


def phi():
    """Partial rotary (half of each head), attention and MLP in parallel."""
    return build(
        "PhiForCausalLM", "PhiConfig", frozen=True, num_hidden_layers=2, hidden_size=32,
        num_attention_heads=4, intermediate_size=64, **_DECODER,
    )  # fmt: skip


def gpt2_lm(layers: int = 2, vocab: int = VOCAB):
    return build(
        "GPT2LMHeadModel", "GPT2Config", n_layer=layers, n_head=2, n_embd=32, vocab_size=vocab,
        n_positions=32,
    )  # fmt: skip


def llama_lm(layers: int = 2, vocab: int = VOCAB):
    return build(
        "LlamaForCausalLM", "LlamaConfig", num_hidden_layers=layers, hidden_size=32,
        intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, vocab_size=vocab,
        max_position_embeddings=64,
    )  # fmt: skip


def bert_mlm(layers: int = 2, vocab: int = VOCAB):
    return build(
        "BertForMaskedLM", "BertConfig", num_hidden_layers=layers, hidden_size=32,
        intermediate_size=64, num_attention_heads=2, vocab_size=vocab, max_position_embeddings=64,
    )  # fmt: skip


def ids(seed: int, n: int = 6) -> torch.Tensor:
    return torch.randint(0, VOCAB, (1, n), generator=torch.Generator().manual_seed(seed))


def prompts(n: int = 8, vocab: int = VOCAB, changed: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """A clean prompt and a corrupted one that differs at position ``changed``."""
    g = torch.Generator().manual_seed(1)
    clean = torch.randint(0, vocab, (1, n), generator=g)
    corrupt = clean.clone()
    corrupt[0, changed] = (clean[0, changed] + 1) % vocab
    return clean, corrupt


def main_output(output):
    """The tensor a test compares: logits, or the last hidden state of an encoder."""
    return output.logits if hasattr(output, "logits") else output.last_hidden_state
