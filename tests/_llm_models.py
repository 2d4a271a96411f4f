"""Tiny transformers LLMs with random weights, built from configs (no download)."""

from __future__ import annotations

import pytest
import torch


def _transformers():
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    return transformers


def gpt2(layers: int = 2, vocab: int = 100):
    t = _transformers()
    torch.manual_seed(0)
    config = t.GPT2Config(n_layer=layers, n_head=2, n_embd=32, vocab_size=vocab, n_positions=32)
    return t.GPT2LMHeadModel(config).eval()


def llama(layers: int = 2, vocab: int = 100):
    t = _transformers()
    torch.manual_seed(0)
    config = t.LlamaConfig(
        num_hidden_layers=layers, hidden_size=32, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=vocab, max_position_embeddings=64,
    )  # fmt: skip
    return t.LlamaForCausalLM(config).eval()


def bert(layers: int = 2, vocab: int = 100):
    t = _transformers()
    torch.manual_seed(0)
    config = t.BertConfig(
        num_hidden_layers=layers, hidden_size=32, intermediate_size=64, num_attention_heads=2,
        vocab_size=vocab, max_position_embeddings=64,
    )  # fmt: skip
    return t.BertForMaskedLM(config).eval()


def prompts(n: int = 8, vocab: int = 100, changed: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """A clean prompt and a corrupted one that differs at position ``changed``."""
    g = torch.Generator().manual_seed(1)
    clean = torch.randint(0, vocab, (1, n), generator=g)
    corrupt = clean.clone()
    corrupt[0, changed] = (clean[0, changed] + 1) % vocab
    return clean, corrupt
