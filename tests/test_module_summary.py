"""tl.summary / trace.summary(by="module"): per module call shapes, parameters, FLOPs."""

from __future__ import annotations

import sys
import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

import torchlens as tl
from tests._tiny_llms import build
from torchlens.errors import InvalidArgumentError, MissingDependencyError


def _torch_flops(model, *args) -> int:
    with FlopCounterMode(display=False) as counter:
        model(*args)
    return counter.get_total_flops()


class Matmuls(nn.Module):
    def forward(self, a, b, c):
        return (a @ b).sum() + torch.matmul(a[0], b[0, 0]).sum() + torch.bmm(a, c).sum()


class SDPA(nn.Module):
    def forward(self, q, k, v):
        with sdpa_kernel(SDPBackend.MATH):  # kernels FlopCounterMode has formulas for on CPU
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class HandAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(8, 24)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        weights = torch.softmax(q @ k.transpose(-2, -1) / 8**0.5, dim=-1)
        return weights @ v


CASES = {
    "linear": (lambda: nn.Linear(6, 5), lambda: (torch.randn(3, 7, 6),)),
    "linear_no_bias": (lambda: nn.Linear(6, 5, bias=False), lambda: (torch.randn(4, 6),)),
    "conv2d": (
        lambda: nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2),
        lambda: (torch.randn(2, 4, 9, 9),),
    ),
    "conv1d_unbatched": (lambda: nn.Conv1d(3, 5, 2), lambda: (torch.randn(3, 10),)),
    "conv_transpose2d": (
        lambda: nn.ConvTranspose2d(3, 2, 3, stride=2),
        lambda: (torch.randn(1, 3, 5, 5),),
    ),
    "matmul": (
        Matmuls,
        lambda: (torch.randn(2, 3, 4), torch.randn(2, 1, 4, 5), torch.randn(2, 4, 6)),
    ),
    "sdpa": (SDPA, lambda: tuple(torch.randn(2, 3, 6, 8) for _ in range(3))),
    "mha": (
        lambda: nn.MultiheadAttention(8, 2, batch_first=True),
        lambda: tuple(torch.randn(2, 5, 8) for _ in range(3)),
    ),
    "mha_cross": (
        lambda: nn.MultiheadAttention(8, 2, kdim=4, vdim=6),
        lambda: (torch.randn(5, 2, 8), torch.randn(7, 2, 4), torch.randn(7, 2, 6)),
    ),
    "hand_attention": (HandAttention, lambda: (torch.randn(2, 5, 8),)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_flops_match_flop_counter_mode(name):
    make_model, make_inputs = CASES[name]
    torch.manual_seed(0)
    model, args = make_model().eval(), make_inputs()
    expected = _torch_flops(model, *args)
    assert expected > 0
    result = tl.summary(model, args)
    assert result.totals["flops"] == expected
    assert result.totals["macs"] == expected // 2
    assert result.rows[0].flops == expected  # the root call holds every op


def test_rows_shapes_params_and_bytes():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2)).eval()
    model[0].requires_grad_(False)
    result = tl.summary(model, torch.randn(3, 4))
    assert [r.name for r in result.rows] == ["<root>:1", "0:1", "1:1", "2:1", "3:1"]
    first = result["0:1"]
    assert (first.module_type, first.depth) == ("Linear", 1)
    assert (first.input_shapes, first.output_shapes) == (((3, 4),), ((3, 8),))
    assert (first.params, first.frozen, first.flops) == (0, 40, 2 * 3 * 4 * 8)
    assert first.output_bytes == 3 * 8 * 4
    norm = result["1:1"]
    assert (norm.params, norm.buffers, norm.unknown_ops) == (16, 8 + 8 + 1, 1)  # + batch count
    assert result["2:1"].unknown_ops == 1 and result["2:1"].flops == 0  # relu: unknown, not 0
    totals = result.totals
    assert (totals["params"], totals["frozen"], totals["buffers"]) == (16 + 18, 40, 17)
    assert totals["flops"] == 2 * 3 * 4 * 8 + 2 * 3 * 8 * 2 and totals["unknown_ops"] == 2
    assert totals["activation_bytes"] == 4 * (24 + 24 + 24 + 6)
    text = str(result)
    assert "BatchNorm1d" in text and "+ 2 ops of unknown cost" in text
    assert "<table>" in result._repr_html_() and "BatchNorm1d" in result._repr_html_()


def test_a_model_counts_every_parameter_a_trace_those_read():
    class Unused(nn.Module):
        def __init__(self):
            super().__init__()
            self.used, self.spare = nn.Linear(2, 2), nn.Linear(2, 3)
            self.bn = nn.BatchNorm1d(2).eval()

        def forward(self, x):
            return self.bn(self.used(x))

    model, x = Unused(), torch.randn(4, 2)
    from_model, from_trace = tl.summary(model, x), tl.summary(tl.trace(model, x))
    assert from_model.totals["params"] == 6 + 9 + 4 and from_model["<root>:1"].params == 19
    assert from_trace.totals["params"] == 6 + 4 and from_trace["<root>:1"].params == 10
    assert from_model["bn:1"].buffers == 5 and from_trace["bn:1"].buffers == 4
    assert "spare:1" not in [r.name for r in from_model.rows]  # it was never called


def test_shared_module_counts_its_params_once():
    lin = nn.Linear(3, 3)
    model = nn.Sequential(lin, nn.Tanh(), lin)
    result = tl.summary(model, torch.randn(2, 3))
    assert [r.name for r in result.rows] == ["<root>:1", "0:1", "1:1", "0:2"]
    assert result["0:2"].params == 12 and result.totals["params"] == 12


def test_trace_summary_by_module_and_structure_only():
    model, x = nn.Sequential(nn.Linear(4, 3), nn.ReLU()), torch.randn(2, 4)
    full = tl.trace(model, x)
    bare = tl.trace(model, x, structure_only=True)
    text = full.summary(by="module")
    assert text == bare.summary(by="module") == str(tl.summary(bare))
    assert text.splitlines()[2].startswith("<root>:1")
    only = full.summary(by="module", module="1")
    assert "ReLU" in only and "Linear" not in only.split("\n")[2:-1][0]
    assert full.summary() == str(full)  # the op table is unchanged
    for bad in ({"by": "layer"}, {"by": "module", "select": tl.func("relu")}):
        with pytest.raises(InvalidArgumentError) as err:
            full.summary(**bad)
        assert err.value.code == "bad_summary"


def test_to_pandas(monkeypatch):
    result = tl.summary(nn.Linear(2, 2), torch.randn(1, 2))
    fake = types.ModuleType("pandas")
    fake.DataFrame = lambda rows: ("frame", rows)
    monkeypatch.setitem(sys.modules, "pandas", fake)
    kind, rows = result.to_pandas()
    assert kind == "frame" and rows == result.to_dicts()
    assert (rows[0]["name"], rows[0]["flops"], rows[0]["params"]) == ("<root>:1", 8, 6)
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(MissingDependencyError) as err:
        result.to_pandas()
    assert err.value.code == "pandas_missing"


def test_multi_head_attention_formula_when_recorded_as_one_call():
    """Whether ``F.multi_head_attention_forward`` is recorded whole or by its parts, its
    FLOPs are the kernels' (the parts are covered by the "mha" cases above)."""
    from torchlens.debug.flops import op_flops
    from torchlens.trace import ArgRef

    mha = nn.MultiheadAttention(8, 2, kdim=4, vdim=6)
    q, k, v = torch.randn(5, 2, 8), torch.randn(7, 2, 4), torch.randn(7, 2, 6)
    shapes = {"query": q.shape, "key": k.shape, "value": v.shape}
    op = types.SimpleNamespace(
        func_name="multi_head_attention_forward",
        output_index=0,
        shape=(5, 2, 8),
        parent_args=tuple(ArgRef(name, str(i)) for i, name in enumerate(shapes)),
        args_template=(None, None, None, 8, 2),
        kwargs_template={},
    )
    assert op_flops(op, lambda label: tuple(shapes[label])) == _torch_flops(mha, q, k, v)
    assert op_flops(types.SimpleNamespace(func_name="erf", output_index=0), None) is None
    assert op_flops(types.SimpleNamespace(func_name="view", output_index=0), None) == 0


class Blocks(nn.Module):
    """Children held in a ModuleList and a ModuleDict, which are never called themselves."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(4, 4)
        self.drop = nn.Dropout(0.0)
        self.h = nn.ModuleList([nn.Sequential(nn.Linear(4, 4), nn.ReLU()) for _ in range(2)])
        self.heads = nn.ModuleDict({"a": nn.Linear(4, 2), "b": nn.Linear(4, 3)})

    def forward(self, x):
        x = self.drop(self.embed(x))
        for block in self.h:
            x = block(x)
        return self.heads["a"](x), self.heads["b"](x)


def test_module_list_and_dict_children_nest_under_the_module_that_calls_them():
    result = tl.summary(Blocks().eval(), torch.randn(2, 4))
    depths = {row.name: row.depth for row in result.rows}
    assert depths == {
        "<root>:1": 0, "embed:1": 1, "drop:1": 1, "h.0:1": 1, "h.0.0:1": 2, "h.0.1:1": 2,
        "h.1:1": 1, "h.1.0:1": 2, "h.1.1:1": 2, "heads.a:1": 1, "heads.b:1": 1,
    }  # fmt: skip
    lines = str(result).splitlines()[2:-1]
    indents = {line.split()[0]: len(line) - len(line.lstrip()) for line in lines}
    assert indents["h.0:1"] == indents["drop:1"] == 2 and indents["h.0.0:1"] == 4


@pytest.fixture(scope="module")
def gpt2():
    model = build(
        "GPT2LMHeadModel", "GPT2Config", n_layer=2, n_embd=64, n_head=4, n_positions=64,
        vocab_size=100, bos_token_id=0, eos_token_id=0, attn_implementation="sdpa",
    )  # fmt: skip
    return model, torch.randint(0, 100, (1, 16))


def test_gpt2_blocks_sit_beside_drop_not_inside_it(gpt2):
    model, ids = gpt2
    result = tl.summary(model, (ids,))
    depths = {row.name: row.depth for row in result.rows}
    assert depths["transformer:1"] == 1
    assert depths["transformer.drop:1"] == depths["transformer.h.0:1"] == 2
    assert depths["transformer.h.1:1"] == 2 and depths["transformer.h.0.attn:1"] == 3
    assert depths["transformer.h.0.attn.c_attn:1"] == 4 and depths["lm_head:1"] == 1


def test_flops_beyond_flop_counter_mode_are_exactly_the_sdpa_matmuls(gpt2):
    """On the CPU, SDPA's default kernel reports nothing to FlopCounterMode; torchlens counts
    its two matrix products. Under the MATH kernel, which runs them as plain products, the
    totals agree."""
    model, ids = gpt2
    trace = tl.trace(model, (ids,), structure_only=True)
    attention = [op for op in trace if op.func_name == "scaled_dot_product_attention"]
    assert len(attention) == 2  # one per layer
    matmuls = 0
    for op in attention:
        q, k = (trace[ref.label].shape for ref in op.parent_args[:2])
        batch, heads, queries, dim = q
        matmuls += 2 * 2 * batch * heads * queries * k[-2] * dim  # q @ k.T, then weights @ v
    ours = tl.summary(trace).totals["flops"]
    assert ours - _torch_flops(model, ids) == matmuls == 2 * 4 * 4 * 16 * 16 * 16
    with sdpa_kernel(SDPBackend.MATH):
        assert _torch_flops(model, ids) == ours
