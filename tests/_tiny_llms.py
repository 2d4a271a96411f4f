"""Tiny transformers language models built from configs (random weights, no download)."""

from __future__ import annotations

import pytest
import torch

VOCAB = 100


def _transformers():
    return pytest.importorskip("transformers")


def gpt2(attn: str = "sdpa"):
    tf = _transformers()
    config = tf.GPT2Config(
        n_layer=2, n_embd=32, n_head=4, vocab_size=VOCAB, n_positions=64,
        bos_token_id=0, eos_token_id=0, attn_implementation=attn,
    )  # fmt: skip
    torch.manual_seed(0)
    return tf.GPT2LMHeadModel(config).eval().requires_grad_(False)


def bert(attn: str = "sdpa"):
    tf = _transformers()
    config = tf.BertConfig(
        num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=64,
        vocab_size=VOCAB, max_position_embeddings=64, attn_implementation=attn,
    )  # fmt: skip
    torch.manual_seed(0)
    return tf.BertModel(config).eval().requires_grad_(False)


def llama(attn: str = "sdpa"):
    tf = _transformers()
    config = tf.LlamaConfig(
        num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, vocab_size=VOCAB, max_position_embeddings=64,
        bos_token_id=0, eos_token_id=0, attn_implementation=attn,
    )  # fmt: skip
    torch.manual_seed(0)
    return tf.LlamaForCausalLM(config).eval().requires_grad_(False)


def mistral(attn: str = "sdpa", sliding_window: int = 3):
    tf = _transformers()
    config = tf.MistralConfig(
        num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, vocab_size=VOCAB, max_position_embeddings=64,
        sliding_window=sliding_window, bos_token_id=0, eos_token_id=0, attn_implementation=attn,
    )  # fmt: skip
    torch.manual_seed(0)
    return tf.MistralForCausalLM(config).eval().requires_grad_(False)


def ids(seed: int, n: int = 6) -> torch.Tensor:
    return torch.randint(0, VOCAB, (1, n), generator=torch.Generator().manual_seed(seed))


def main_output(output):
    """The tensor a test compares: logits, or the last hidden state of an encoder."""
    return output.logits if hasattr(output, "logits") else output.last_hidden_state
