"""``model.generate`` as a first-class trace (tiny Llama and GPT-2 from configs).

Each decoding step is one call of the model's forward: a call of the root address ``""``
(``"<root>:k"`` for step ``k``; the whole ``generate`` is ``"<root>:0"``), and call ``k`` of
every submodule the step runs once (``tl.module("model.layers.0", call=2)``).
"""

from __future__ import annotations

import pytest
import torch

import torchlens as tl
from torchlens import edits

transformers = pytest.importorskip("transformers")

VOCAB, STEPS = 96, 3


def _llama():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, num_key_value_heads=2, max_position_embeddings=64,
        attn_implementation="eager",
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config).eval()


def _gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64,
        attn_implementation="eager",
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config).eval()


def _kwargs(**options):
    torch.manual_seed(1)
    ids = torch.randint(3, VOCAB, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.long)
    return dict(input_ids=ids, attention_mask=mask, max_new_tokens=STEPS, pad_token_id=0, **options)


MODES = {
    "greedy": dict(do_sample=False),
    "beam": dict(do_sample=False, num_beams=2),
    "sampling": dict(do_sample=True, top_k=20),
}
MODELS = {"llama": (_llama, "model.layers.0"), "gpt2": (_gpt2, "transformer.h.0")}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", MODELS)
def test_generate_records_each_step_as_a_call_with_every_weight(name, mode):
    build, layer = MODELS[name]
    model, kwargs = build(), _kwargs(**MODES[mode])
    torch.manual_seed(2)
    trace = tl.trace(model.generate, kwargs=kwargs)
    torch.manual_seed(2)
    assert torch.equal(trace.output, model.generate(**kwargs))
    assert [m.name for m in trace.module_calls("")] == [f"<root>:{k}" for k in range(STEPS + 1)]
    assert trace.modules[0].module_type == f"{type(model).__name__}.generate"
    assert [m.call_index for m in trace.module_calls(layer)] == list(range(1, STEPS + 1))
    ran = {m.address for m in trace.modules}
    weights, seen = set(), set()  # each tensor at its first address (GPT-2 ties lm_head)
    for address, module in model.named_modules():
        for n, p in module.named_parameters(recurse=False):
            if address in ran and id(p) not in seen:
                weights.add(f"{address}.{n}" if address else n)
            seen.add(id(p))
    assert {s.path for s in trace.sources if s.kind == "parameter"} == weights
    assert len(weights) == len(dict(model.named_parameters()))  # every module ran
    assert not [s for s in trace.sources if s.kind == "constant"]
    if mode != "beam":  # (beam search is validated in the zoo)
        torch.manual_seed(2)
        status = tl.replay(model.generate, kwargs=kwargs, random_seed=None)
        assert status.state == "passed", str(status)


def test_call_picks_a_decoding_step_and_no_call_matches_every_step():
    model, kwargs = _llama(), _kwargs(do_sample=False)
    every = tl.trace(model.generate, kwargs=kwargs, save=tl.module("model.layers.0").output)
    kept = [op for op in every if op.has_out]
    assert len(kept) == STEPS
    assert [op.returned_by[0][:2] for op in kept] == [("model.layers.0", k) for k in (1, 2, 3)]
    step2 = tl.trace(model.generate, kwargs=kwargs, save=tl.module("", call=2))
    ops = [op for op in step2 if op.has_out]
    assert ops and all(("", 2) in op.module_stack for op in ops)
    assert len(ops) == len([op for op in every if ("", 2) in op.module_stack])


def _steering(model, layer, direction):
    return model.get_submodule(layer), lambda module, args, output: output + direction


@pytest.mark.parametrize("mode", ["greedy", "sampling"])
def test_steering_during_generation_matches_a_forward_hook(mode):
    model, kwargs = _llama(), _kwargs(**MODES[mode])
    torch.manual_seed(5)
    direction = torch.randn(32) * 4
    layer = "model.layers.0.mlp"
    torch.manual_seed(2)
    plain = model.generate(**kwargs)
    module, hook = _steering(model, layer, direction)
    handle = module.register_forward_hook(hook)
    try:
        torch.manual_seed(2)
        hooked = model.generate(**kwargs)
    finally:
        handle.remove()
    torch.manual_seed(2)
    trace = tl.trace(
        model.generate,
        kwargs=kwargs,
        intervene={tl.module(layer).output: edits.add(direction)},
    )
    assert not torch.equal(hooked, plain)  # the steering changes what is generated
    assert torch.equal(trace.output, hooked)
    assert len(trace.meta["intervened"]) == STEPS  # once per step
    torch.manual_seed(2)
    rec = tl.record(
        model.generate, kwargs=kwargs, intervene={tl.module(layer).output: edits.add(direction)}
    )
    assert torch.equal(rec.output, hooked)


def test_record_and_stop_after_on_generate():
    model, kwargs = _llama(), _kwargs(do_sample=False)
    trace = tl.trace(model.generate, kwargs=kwargs)
    rec = tl.record(model.generate, kwargs=kwargs, save=tl.module("lm_head", call=3))
    (label,) = rec.labels
    assert torch.equal(rec[label].out, trace[label].out)
    assert trace[label].module_stack[0] == ("", 3)
    halted = tl.trace(model.generate, kwargs=kwargs, stop_after=tl.module("lm_head", call=2))
    assert halted.meta["halted"] and halted.output is None
    assert halted.ops[-1].module_stack[:2] == (("", 2), ("lm_head", 2))


def test_extract_over_generate(tmp_path):
    model = _llama()
    kwargs = _kwargs(do_sample=False)
    data = [{k: kwargs[k] for k in ("input_ids", "attention_mask")}]
    options = {"max_new_tokens": STEPS, "pad_token_id": 0, "do_sample": False}
    with torch.no_grad():
        trace = tl.trace(model.generate, kwargs=kwargs, save=tl.module("lm_head", call=2).output)
    (kept,) = [op for op in trace if op.has_out]
    result = tl.extract(
        model.generate,
        data,
        save=tl.module("lm_head", call=2).output,
        inputs=lambda batch: {**batch, **options},
        to=tmp_path / "run",
    )
    (site,) = list(result)
    assert torch.allclose(result[site][:], kept.out)


def test_a_generate_trace_draws_saves_and_summarises(tmp_path):
    model, kwargs = _llama(), _kwargs(do_sample=False)
    trace = tl.trace(model.generate, kwargs=kwargs)
    dot = trace.to_dot(depth=1)  # each decoding step a box
    assert all(f"(LlamaForCausalLM) call {k}" in dot for k in range(1, STEPS + 1))
    assert "LlamaForCausalLM" in trace.summary(by="module")
    loaded = tl.load(tl.save(trace, tmp_path / "gen"))
    assert [m.name for m in loaded.module_calls("")] == [m.name for m in trace.module_calls("")]
