"""``trace.rerun`` and ``edits.patch`` on tiny transformers models, against live runs.

Every GPT-2 and BERT block ends its attention and MLP with an eval ``Dropout``, which
returns its argument as it was; Llama's ``RMSNorm`` starts with ``x.to(float32)`` on a
float32 residual, which does too.
"""

from __future__ import annotations

import pytest
import torch

import torchlens as tl
from tests import _tiny_llms as tiny
from torchlens import edits

SITES = {
    "gpt2": ["transformer.h.0.attn", "transformer.h.1.mlp", "transformer.h.0", "transformer.drop"],
    "bert": ["encoder.layer.0.attention.output", "encoder.layer.1.output.dropout", "embeddings"],
    "llama": ["model.layers.0.self_attn", "model.layers.1.mlp", "model.layers.0"],
}


@pytest.mark.parametrize("name", sorted(SITES))
def test_patching_a_module_output_by_rerun_equals_the_live_run(name):
    model = getattr(tiny, name)()
    clean, corrupt = tl.trace(model, tiny.ids(1)), tl.trace(model, tiny.ids(2))
    argument_returned = 0
    for site in SITES[name]:
        patch = edits.patch(corrupt, clean, tl.module(site).output)
        what_if = corrupt.rerun(patch)
        live = tl.trace(model, tiny.ids(2), intervene=patch)
        moved = tiny.main_output(what_if.output) - tiny.main_output(corrupt.output)
        assert moved.abs().max() > 1e-4, site  # the patch changed the output
        torch.testing.assert_close(tiny.main_output(what_if.output), tiny.main_output(live.output))
        argument_returned += any("returns_argument" in corrupt[label].meta
                                 for label in what_if.meta["intervened"])  # fmt: skip
    if name != "llama":  # eval Dropouts end these modules
        assert argument_returned >= 2


def test_editing_every_op_of_a_llama_norm_leaves_the_residual_alone_as_a_live_run_does():
    model = tiny.llama()
    trace = tl.trace(model, tiny.ids(1))
    cast = trace["to_4"]
    assert cast.module == "model.layers.0.input_layernorm"
    assert cast.meta["returns_argument"] == "embedding_1"
    assert any(trace[child].module == "model.layers.0" for child in cast.children)  # residual
    norm = tl.module("model.layers.0.input_layernorm") & tl.where(
        lambda op: op.dtype.is_floating_point
    )
    edit = {norm: lambda t: t * 3 + 1}
    what_if = trace.rerun(edit)
    assert "to_4" in what_if.meta["intervened"]
    live = tl.trace(model, tiny.ids(1), intervene=edit)
    torch.testing.assert_close(what_if.output.logits, live.output.logits)
