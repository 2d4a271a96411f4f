"""The logit lens (torchlens.edits.logit_lens) on tiny GPT-2, Llama and BERT."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens import edits
from torchlens.errors import InvalidArgumentError

from ._tiny_llms import bert_mlm as bert
from ._tiny_llms import gpt2_lm as gpt2
from ._tiny_llms import llama_lm as llama
from ._tiny_llms import prompts

MODELS = {
    "gpt2": (gpt2, "transformer.h", lambda m: nn.Sequential(m.transformer.ln_f, m.lm_head)),
    "llama": (llama, "model.layers", lambda m: nn.Sequential(m.model.norm, m.lm_head)),
    "bert": (bert, "bert.encoder.layer", lambda m: m.cls),
}


def _trace(name: str, **kwargs):
    build, blocks, readout = MODELS[name]
    model = build(layers=3)
    ids, _ = prompts()
    with torch.no_grad():
        return model, tl.trace(model, ids, kwargs=kwargs or None), blocks, readout(model)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_last_layer_lens_equals_the_model_logits(name):
    model, trace, blocks, readout = _trace(name)
    lens = edits.logit_lens(trace)
    assert lens.layers == [f"{blocks}.{i}" for i in range(3)]
    assert lens.logits.shape == (3, 1, 8, 100)
    torch.testing.assert_close(lens.logits[-1], trace.output.logits)
    # every layer: the model's own readout (final norm + output embeddings) on its output
    for i, layer in enumerate(lens.layers):
        (op,) = [op for op in trace if tl.module(layer).output.matches(op)]
        with torch.no_grad():
            torch.testing.assert_close(lens.logits[i], readout(op.out))
    assert not torch.allclose(lens.logits[0], lens.logits[-1])


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_a_given_readout_gives_the_same_lens(name):
    _, trace, _, readout = _trace(name)
    auto, given = edits.logit_lens(trace), edits.logit_lens(trace, readout=readout)
    torch.testing.assert_close(given.logits, auto.logits)


def test_top_tokens_probabilities_and_export():
    pd = pytest.importorskip("pandas")

    class Tokenizer:
        def decode(self, ids):
            return "".join(f"<{i}>" for i in ids)

    _, trace, _, _ = _trace("gpt2")
    lens = edits.logit_lens(trace, top=3, tokenizer=Tokenizer())
    probs, ids = lens.logits.softmax(-1).topk(3, dim=-1)
    assert torch.equal(lens.top_ids, ids)
    torch.testing.assert_close(lens.top_probs, probs)
    assert lens.tokens[1][0][-1] == [f"<{i}>" for i in ids[1, 0, -1].tolist()]
    top = lens.top(position=-1)
    assert top.dims == ("layer", "rank") and torch.equal(top.values, ids[:, 0, -1])
    frame = lens.to_pandas()
    assert isinstance(frame, pd.DataFrame) and len(frame) == 3 * 8 * 3
    assert list(frame.columns) == [
        "layer",
        "batch",
        "position",
        "rank",
        "token_id",
        "prob",
        "token",
    ]
    first = frame.iloc[0]
    assert first.token_id == ids[0, 0, 0, 0].item() and first.token == f"<{first.token_id}>"
    assert "transformer.h.2" in str(lens) and f"<{ids[2, 0, -1, 0].item()}>" in str(lens)


def test_the_logits_are_found_among_several_outputs_with_model():
    model, trace, _, _ = _trace("gpt2", output_hidden_states=True)
    assert len(trace.output_labels) > 1
    with pytest.raises(InvalidArgumentError) as err:
        edits.logit_lens(trace)
    assert err.value.code == "lens_readout" and "model=" in str(err.value)
    lens = edits.logit_lens(trace, model=model)
    torch.testing.assert_close(lens.logits[-1], trace.output.logits)


def test_layers_by_hand_and_their_errors():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8), nn.LayerNorm(8), nn.Linear(8, 20))
    trace = tl.trace(model, torch.randn(2, 4, 8))
    lens = edits.logit_lens(
        trace, layers={"first": tl.label("linear_1"), "second": tl.label("linear_2")}
    )
    assert lens.layers == ["first", "second"]
    with torch.no_grad():
        torch.testing.assert_close(
            lens.logits[0], model[3](model[2](model[0](trace["input_1"].out)))
        )
    torch.testing.assert_close(lens.logits[1], trace.output)
    with pytest.raises(InvalidArgumentError) as err:
        edits.logit_lens(trace)  # no <list>.<i> blocks: "0", "1" are the root's children
    assert err.value.code == "lens_layers"
    with pytest.raises(InvalidArgumentError) as err:
        edits.logit_lens(trace, layers=[tl.func("linear")])
    assert err.value.code == "lens_layers" and "3 ops" in str(err.value)


class _MoEBlock(nn.Module):
    """Four experts inside each block, and a tuple returned: (hidden, router scores)."""

    def __init__(self) -> None:
        super().__init__()
        self.experts = nn.ModuleList(nn.Linear(8, 8) for _ in range(4))
        self.router = nn.Linear(8, 4)

    def forward(self, h):
        scores = self.router(h).softmax(-1)
        mixed = sum(scores[..., i : i + 1] * e(h) for i, e in enumerate(self.experts))
        return h + mixed, scores


class _MoE(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(_MoEBlock() for _ in range(2))
        self.norm, self.head = nn.LayerNorm(8), nn.Linear(8, 20)

    def forward(self, h):
        for layer in self.layers:
            h, _ = layer(h)
        return self.head(self.norm(h))


def test_the_blocks_found_are_the_outermost_and_their_first_output():
    model = _MoE()
    trace = tl.trace(model, torch.randn(1, 5, 8))
    lens = edits.logit_lens(trace)
    assert lens.layers == ["layers.0", "layers.1"]  # not the 4 experts of each block
    with torch.no_grad():
        first = model.layers[0](trace["input_1"].out)[0]  # the hidden state, not the scores
        torch.testing.assert_close(lens.logits[0], model.head(model.norm(first)))
    torch.testing.assert_close(lens.logits[-1], trace.output)


@pytest.mark.parametrize(("name", "block"), [("gpt2", "GPT2Block"), ("llama", "LlamaDecoderLayer")])
def test_a_trace_that_saved_only_the_block_outputs_is_enough(name, block):
    model, full, _, _ = _trace(name)
    ids, _ = prompts()
    with torch.no_grad():
        lean = tl.trace(model, ids, save=tl.module(type=block).output)
    assert sum(op.has_out for op in lean) == 3
    torch.testing.assert_close(edits.logit_lens(lean).logits, edits.logit_lens(full).logits)


class _OnePlusNorm(nn.Module):
    """Gemma's RMSNorm: the weight is read as ``1 + w``, an op on a parameter alone."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(width) * 0.1)

    def forward(self, x):
        scaled = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return scaled * (1.0 + self.weight.float())


class _Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x):
        return x + self.fc(x).tanh()


class _GemmaStyle(nn.Module):
    def __init__(self, width: int = 8, vocab: int = 11) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_Block(width) for _ in range(2))
        self.norm, self.head = _OnePlusNorm(width), nn.Linear(width, vocab)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def test_values_save_left_out_of_the_readout_are_remade_from_the_saved_ones():
    """Gemma and T5: the readout reads ``1 + weight`` (or a constant made in the forward),
    which ``save=`` of the blocks' outputs leaves out; the lens remakes it from the
    parameter instead of refusing, and gives the full trace's logits."""
    torch.manual_seed(0)
    model, x = _GemmaStyle().eval(), torch.randn(2, 3, 8)
    with torch.no_grad():
        full = tl.trace(model, x)
        lean = tl.trace(model, x, save=tl.module(type="_Block").output)
    [one_plus] = [op for op in lean if op.func_name == "add" and op.parents == ("float_1",)]
    assert lean["float_1"].parents == ("norm.weight",)
    assert not one_plus.has_out  # (it reads the parameter alone: not a block output)
    torch.testing.assert_close(
        edits.logit_lens(lean).logits, edits.logit_lens(full).logits, rtol=0, atol=0
    )
