"""Attention patterns of ``scaled_dot_product_attention`` ops (``tl.attention_pattern``) and
edits of them (``edits.edit_pattern``), against eager attention's own softmax."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchlens as tl
from tests import _tiny_llms as tiny
from torchlens import edits
from torchlens.attention import attention_inputs
from torchlens.errors import (
    InterventionError,
    InvalidArgumentError,
    PayloadUnavailableError,
    SelectorMatchError,
)

SDPA = tl.func("scaled_dot_product_attention")


def _sdpa_ops(trace):
    return [op for op in trace if op.func_name == "scaled_dot_product_attention"]


def _eager_twin(name):
    """The model with SDPA attention and the same weights with eager attention."""
    make = getattr(tiny, name)
    sdpa, eager = make("sdpa"), make("eager")
    eager.load_state_dict(sdpa.state_dict())
    return sdpa, eager


@pytest.mark.parametrize("name", ["gpt2", "bert", "llama", "mistral"])
def test_the_pattern_equals_eager_attentions_softmax(name):
    sdpa, eager = _eager_twin(name)
    ids = tiny.ids(3, n=7)
    kwargs = {"attention_mask": torch.tensor([[1, 1, 1, 1, 1, 0, 0]])} if name == "bert" else {}
    trace = tl.trace(sdpa, (ids,), kwargs)
    with torch.no_grad():
        reference = eager(ids, output_attentions=True, **kwargs).attentions
    ops = _sdpa_ops(trace)
    assert len(ops) == len(reference) == 2
    for op, expected in zip(ops, reference):
        pattern = tl.attention_pattern(op)
        assert pattern.shape == (1, 4, 7, 7)
        torch.testing.assert_close(pattern, expected)
        torch.testing.assert_close(pattern.sum(-1), torch.ones(1, 4, 7))
    inputs = attention_inputs(ops[0])
    if name == "llama":  # 2 key/value heads shared by 4 query heads
        assert inputs.enable_gqa and inputs.key.shape[1] == 2
    if name == "bert":  # the padded keys get nothing
        assert inputs.attn_mask is not None and pattern[..., 5:].abs().max() == 0
    if name == "mistral":  # a sliding window of 3: the last query sees keys 4, 5 and 6
        assert inputs.attn_mask is not None
        assert pattern[0, :, 6, :4].abs().max() == 0 and pattern[0, :, 6, 4:].min() > 0


def _by_hand(q, k, mask=None, causal=False, scale=None):
    scores = q @ k.transpose(-2, -1) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if causal:
        scores = scores.masked_fill(torch.ones(scores.shape[-2:]).tril() == 0, float("-inf"))
    if mask is not None:
        scores = (
            scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
        )
    return scores.softmax(-1)


def test_options_given_by_position_or_keyword_are_read_from_the_record():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 6, 8), torch.randn(2, 2, 6, 8)
    bias = torch.randn(5, 6)

    def forward(q, k, v, bias):
        a = F.scaled_dot_product_attention(q, k, v, bias, 0.0, False, scale=0.3, enable_gqa=True)
        b = F.scaled_dot_product_attention(q[:, :2], k, v, is_causal=True)
        return a, b

    trace = tl.trace(forward, (q, k, v, bias))
    first, second = _sdpa_ops(trace)
    expected = _by_hand(q, k.repeat_interleave(2, 1), bias, scale=0.3)
    torch.testing.assert_close(tl.attention_pattern(first), expected)
    torch.testing.assert_close(tl.attention_pattern(second), _by_hand(q[:, :2], k, causal=True))
    # the pattern times v gives back what the kernel computed
    v4 = v.repeat_interleave(2, 1)
    torch.testing.assert_close(tl.attention_pattern(first) @ v4, first.out)


def test_a_query_with_nothing_to_attend_gets_zeros():
    q = torch.randn(1, 1, 2, 4)
    mask = torch.tensor([[True, True], [False, False]])
    trace = tl.trace(lambda q: F.scaled_dot_product_attention(q, q, q, mask), q)
    pattern = tl.attention_pattern(_sdpa_ops(trace)[0])
    assert pattern[0, 0, 1].tolist() == [0.0, 0.0] and torch.isfinite(pattern).all()


def test_attention_pattern_refuses_other_ops_and_unsaved_inputs():
    model = nn.Sequential(nn.Linear(4, 4))
    trace = tl.trace(model, torch.randn(1, 4))
    with pytest.raises(InvalidArgumentError) as err:
        tl.attention_pattern(trace["linear_1"])
    assert err.value.code == "not_attention" and "'linear_1'" in str(err.value)
    with pytest.raises(InvalidArgumentError) as err:
        tl.attention_pattern(trace.sources[0])
    assert err.value.code == "not_attention"
    q = torch.randn(1, 2, 3, 4)
    fn = lambda q: F.scaled_dot_product_attention(q * 2, q, q)  # noqa: E731
    only = tl.trace(fn, q, save=SDPA)
    with pytest.raises(PayloadUnavailableError) as err:
        tl.attention_pattern(_sdpa_ops(only)[0])
    assert err.value.code == "not_saved" and "tl.label('mul_1')" in str(err.value)
    skeleton = tl.trace(fn, q, structure_only=True)
    with pytest.raises(PayloadUnavailableError):
        tl.attention_pattern(_sdpa_ops(skeleton)[0])


def test_a_softmax_selector_on_an_sdpa_model_says_why_it_matched_nothing():
    sdpa, eager = _eager_twin("gpt2")
    with pytest.raises(SelectorMatchError) as err:
        tl.trace(sdpa, tiny.ids(1), save=tl.func("softmax"))
    assert err.value.code == "no_match"
    assert "scaled_dot_product_attention" in str(err.value)
    assert "tl.attention_pattern" in str(err.value) and "eager" in str(err.value)
    # the eager model records the softmax: the same probabilities
    softmaxes = [op for op in tl.trace(eager, tiny.ids(1), save=tl.func("softmax")) if op.has_out]
    for softmax, op in zip(softmaxes, _sdpa_ops(tl.trace(sdpa, tiny.ids(1))), strict=True):
        torch.testing.assert_close(softmax.out, tl.attention_pattern(op))
    with pytest.raises(SelectorMatchError) as err:  # no SDPA op: no such hint
        tl.trace(nn.Linear(2, 2), torch.randn(1, 2), save=tl.func("softmax"))
    assert "attention_pattern" not in str(err.value)


def _zero_row(head, query):
    def fn(pattern):
        pattern = pattern.clone()
        pattern[:, head, query] = 0
        return pattern

    return fn


@pytest.mark.parametrize("name", ["gpt2", "bert", "llama"])
def test_zeroing_a_heads_pattern_row_zeroes_that_output_row_live_and_in_rerun(name):
    model = getattr(tiny, name)()
    ids = tiny.ids(4)
    trace = tl.trace(model, ids)
    first = _sdpa_ops(trace)[0]
    edit = {tl.label(first.label): edits.edit_pattern(_zero_row(head=2, query=3))}
    live = tl.trace(model, ids, intervene=edit)
    what_if = trace.rerun(edit)
    for result in (live, what_if):
        out = result[first.label].out
        assert out[0, 2, 3].abs().max() == 0  # the zeroed row attends to nothing
        inputs = attention_inputs(first)
        pattern = _zero_row(2, 3)(tl.attention_pattern(first))
        v = inputs.value.repeat_interleave(4 // inputs.value.shape[1], 1)
        torch.testing.assert_close(out, pattern @ v)  # the expected recomputation
        keep = torch.ones_like(out, dtype=torch.bool)
        keep[0, 2, 3] = False
        torch.testing.assert_close(out[keep], first.out[keep])  # everything else as it was
    assert tiny.main_output(live.output).ne(tiny.main_output(trace.output)).any()
    torch.testing.assert_close(tiny.main_output(what_if.output), tiny.main_output(live.output))


def test_a_pattern_edit_after_a_patch_reads_the_patched_q_and_k_in_rerun():
    model = tiny.gpt2()
    clean, corrupt = tl.trace(model, tiny.ids(1)), tl.trace(model, tiny.ids(2))
    second = _sdpa_ops(corrupt)[1]
    both = {
        **edits.patch(corrupt, clean, tl.module("transformer.h.0").output),
        tl.label(second.label): edits.edit_pattern(lambda p, op: p.flip(-1).tril()),
    }
    live = tl.trace(model, tiny.ids(2), intervene=both)
    what_if = corrupt.rerun(both)
    torch.testing.assert_close(what_if.output.logits, live.output.logits)
    torch.testing.assert_close(what_if[second.label].out, live[second.label].out)


def test_edit_pattern_refuses_other_ops_and_a_reshaped_pattern():
    with pytest.raises(InvalidArgumentError) as err:
        edits.edit_pattern("zero")
    assert err.value.code == "bad_edit"
    model = nn.Sequential(nn.Linear(4, 4))
    with pytest.raises(InterventionError) as err:
        tl.trace(
            model, torch.randn(1, 4), intervene={tl.func("linear"): edits.edit_pattern(lambda p: p)}
        )
    assert err.value.code == "bad_edit" and "scaled_dot_product_attention" in str(err.value)
    q = torch.randn(1, 2, 3, 4)
    fn = lambda q: F.scaled_dot_product_attention(q, q, q)  # noqa: E731
    with pytest.raises(InterventionError) as err:
        tl.trace(fn, q, intervene={SDPA: edits.edit_pattern(lambda p: p[..., :2])})
    assert err.value.code == "bad_edit" and "(1, 2, 3, 3)" in str(err.value)


def test_tl_record_views_are_refused_with_the_reason():
    q = torch.randn(1, 2, 3, 4)
    fn = lambda q: F.scaled_dot_product_attention(q, q, q)  # noqa: E731
    with pytest.raises(InterventionError) as err:
        tl.record(fn, q, intervene={SDPA: edits.edit_pattern(lambda p: p)})
    assert err.value.code == "bad_edit" and "tl.record" in str(err.value)


def test_multihead_attention_without_weights_gives_the_weights_it_would_have_returned():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 4, batch_first=True).eval()
    x = torch.randn(2, 5, 16)
    padding = torch.tensor([[False] * 5, [False, False, False, True, True]])
    causal = torch.ones(5, 5, dtype=torch.bool).triu(1)  # True: not allowed
    call = {"key_padding_mask": padding, "attn_mask": causal, "need_weights": False}
    trace = tl.trace(mha, (x, x, x), call)
    (op,) = _sdpa_ops(trace)
    with torch.no_grad():
        _, weights = mha(x, x, x, key_padding_mask=padding, attn_mask=causal,
                         need_weights=True, average_attn_weights=False)  # fmt: skip
    torch.testing.assert_close(tl.attention_pattern(op), weights)


def test_attend_refuses_a_pattern_that_does_not_fit_the_call():
    from torchlens.attention import AttentionInputs, attend

    q, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 5, 4)
    inputs = AttentionInputs(q, v, v, None, False, None, False, 0.0)
    torch.testing.assert_close(
        attend(torch.full((1, 2, 3, 5), 0.2), inputs), v.mean(-2, True).expand(1, 2, 3, 4)
    )
    for bad in (torch.ones(1, 2, 5, 3), "pattern"):
        with pytest.raises(InvalidArgumentError) as err:
            attend(bad, inputs)
        assert err.value.code == "bad_pattern" and "(1, 2, 3, 5)" in str(err.value)


def test_a_saved_and_loaded_trace_gives_the_same_pattern(tmp_path):
    model = tiny.llama()
    trace = tl.trace(model, tiny.ids(1))
    tl.save(trace, tmp_path / "run")
    loaded = tl.load(tmp_path / "run")
    for op in _sdpa_ops(trace):
        assert torch.equal(tl.attention_pattern(loaded[op.label]), tl.attention_pattern(op))


def test_left_padding_queries_attend_to_nothing_and_the_rest_equal_eager():
    sdpa, eager = _eager_twin("llama")
    ids, mask = tiny.ids(3, n=7), torch.tensor([[0, 0, 1, 1, 1, 1, 1]])
    trace = tl.trace(sdpa, (ids,), {"attention_mask": mask})
    with torch.no_grad():
        reference = eager(ids, attention_mask=mask, output_attentions=True).attentions
    for op, expected in zip(_sdpa_ops(trace), reference, strict=True):
        pattern = tl.attention_pattern(op)
        torch.testing.assert_close(pattern[..., 2:, :], expected[..., 2:, :])
        assert pattern[..., :2, :].abs().max() == 0  # eager: 1/7 each, from finfo.min
        assert pattern[..., 2:, :2].abs().max() == 0  # nobody attends to the padding
        v = attention_inputs(op).value
        v = v.repeat_interleave(4 // v.shape[1], 1)
        torch.testing.assert_close(pattern @ v, op.out)  # what the kernel computed


def _gqa_llama(implementation: str):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, num_key_value_heads=2, max_position_embeddings=64,
        attn_implementation=implementation,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config).eval()


def _padded_kwargs():
    torch.manual_seed(1)
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[0, :2] = 0  # left padding: a mask, so transformers packs each decoding step
    ids = torch.randint(3, 96, (2, 6))
    return dict(input_ids=ids, attention_mask=mask, max_new_tokens=3, pad_token_id=0,
                do_sample=False)  # fmt: skip


def test_decode_step_patterns_have_query_heads_whatever_transformers_packed():
    kwargs = _padded_kwargs()
    trace = tl.trace(_gqa_llama("sdpa").generate, kwargs=kwargs)
    eager = tl.trace(_gqa_llama("eager").generate, kwargs=_padded_kwargs())
    calls = [op for op in trace if op.func_name == "scaled_dot_product_attention"]
    softmaxes = [op for op in eager if op.func_name == "softmax"]
    assert len(calls) == len(softmaxes) == 6
    packed = [op for op in calls if tuple(attention_inputs(op).query.shape) == (2, 2, 2, 8)]
    assert len(packed) == 4  # the decoding steps: query heads packed by key group
    for op, soft in zip(calls, softmaxes):
        pattern = tl.attention_pattern(op)
        assert pattern.shape == soft.out.shape  # (batch, heads, queries, keys)
        assert pattern.shape[:3] in ((2, 4, 6), (2, 4, 1))
        torch.testing.assert_close(pattern[1], soft.out[1])  # (row 0 has padding keys)
        first = 2 if pattern.shape[2] == 6 else 0  # (padding queries: zeros vs even rows)
        torch.testing.assert_close(pattern[0, :, first:, 2:], soft.out[0, :, first:, 2:])
    seen = []
    keep = edits.edit_pattern(lambda p: seen.append(tuple(p.shape)) or p)
    live = tl.trace(_gqa_llama("sdpa").generate, kwargs=kwargs,
                    intervene={tl.func("scaled_dot_product_attention"): keep})  # fmt: skip
    assert torch.equal(live.output, trace.output)
    assert seen == [(2, 4, 6, 6)] * 2 + [(2, 4, 1, 7)] * 2 + [(2, 4, 1, 8)] * 2
    # head 3 is query head 3 (key group 1), as in an unpacked call
    only = edits.edit_pattern(lambda p: torch.cat([p[:, :3], torch.zeros_like(p[:, 3:])], 1))
    edited = trace.rerun({tl.label(packed[0].label): only}, escapes="recorded")
    out = edited[packed[0].label].out
    base = packed[0].out.reshape(2, 4, 1, 8)  # (batch, heads, 1, dim), as transformers unpacks
    new = out.reshape(2, 4, 1, 8)
    assert torch.equal(new[:, 3], torch.zeros_like(new[:, 3]))
    torch.testing.assert_close(new[:, :3], base[:, :3])


def test_a_packed_query_is_told_by_its_trace_and_refused_without_one():
    import gc

    from torchlens.errors import InvalidArgumentError

    torch.manual_seed(0)
    q, k, v = torch.randn(1, 4, 1, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)

    def packed(q, k, v):  # transformers' pack_gqa: 4 query heads as 2 groups of 2
        return F.scaled_dot_product_attention(q.reshape(1, 2, 2, 8), k, v)

    def two_queries(q, k, v):  # a real call of 2 queries per head: left as it is
        return F.scaled_dot_product_attention(q.reshape(1, 2, 2, 8).transpose(-2, -2), k, v)

    trace = tl.trace(packed, (q, k, v))
    op = trace["scaled_dot_product_attention_1"]
    pattern = tl.attention_pattern(op)
    assert pattern.shape == (1, 4, 1, 5)
    expected = (q @ k.repeat_interleave(2, dim=1).transpose(-2, -1) / 8**0.5).softmax(-1)
    torch.testing.assert_close(pattern, expected)
    real = tl.trace(two_queries, (q, k, v))["scaled_dot_product_attention_1"]
    assert tl.attention_pattern(real).shape == (1, 2, 2, 5)
    del trace
    gc.collect()
    with pytest.raises(InvalidArgumentError) as info:
        tl.attention_pattern(op)  # its trace is gone: whether it was packed is unknown
    assert info.value.code == "packed_query_unknown"
