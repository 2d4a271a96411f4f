"""Drawing traces: DOT structure (nodes, edges, clusters), depth and repeat folding, rendering,
the missing-Graphviz error, and the notebook HTML tables."""

from __future__ import annotations

import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from torch import nn

try:
    from tests.models import ZOO_BY_NAME
except ImportError:  # repository root not on sys.path (e.g. bare `pytest`)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from models import ZOO_BY_NAME

import torchlens as tl
from torchlens.errors import GraphvizMissingError, InvalidArgumentError
from torchlens.viz import draw, to_dot
from torchlens.viz.repeats import find_repeats

HAS_DOT = shutil.which("dot") is not None
needs_dot = pytest.mark.skipif(
    not HAS_DOT, reason="Graphviz `dot` is not installed (apt-get install graphviz)"
)

STRUCTURE_CASES = [
    "mlp_tiny",
    "transformer_encoder_layer",
    "residual_blocks",
    "max_topk_sort",
    "repeated_submodule",
    "nested_containers",
    "returns_parameter",
    "lstm",
]


@dataclass
class Dot:
    """What the DOT text says: nodes with their enclosing clusters, edges, clusters."""

    nodes: dict[str, tuple[str, ...]] = field(default_factory=dict)  # id -> cluster path
    attrs: dict[str, str] = field(default_factory=dict)  # id -> attribute text
    edges: list[tuple[str, str]] = field(default_factory=list)
    clusters: dict[str, tuple[str, ...]] = field(default_factory=dict)  # id -> parents


_NODE = re.compile(r'^\s*"((?:[^"\\]|\\.)*)" \[(.*)\];$')
_EDGE = re.compile(r'^\s*"((?:[^"\\]|\\.)*)" -> "((?:[^"\\]|\\.)*)";$')
_CLUSTER = re.compile(r'^\s*subgraph "cluster_((?:[^"\\]|\\.)*)" \{$')


def parse(text: str) -> Dot:
    dot, stack = Dot(), []
    for line in text.splitlines():
        if m := _CLUSTER.match(line):
            dot.clusters[m[1]] = tuple(stack)
            stack.append(m[1])
        elif line.strip() == "}" and stack:
            stack.pop()
        elif m := _EDGE.match(line):
            dot.edges.append((m[1], m[2]))
        elif m := _NODE.match(line):
            dot.nodes[m[1]] = tuple(stack)
            dot.attrs[m[1]] = m[2]
    assert not stack, "unbalanced subgraph braces"
    return dot


def _trace(name: str) -> tl.Trace:
    case = ZOO_BY_NAME[name]
    model = case.make_model()
    args, kwargs = case.make_inputs()
    torch.manual_seed(0)
    return tl.trace(model, args, kwargs)


def _calls(trace: tl.Trace) -> dict[tuple[str, int], tl.ModuleCall]:
    return {(m.address, m.call_index): m for m in trace.modules if m.address}


# -- structure -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", STRUCTURE_CASES)
def test_every_op_input_output_and_edge_is_drawn(name):
    trace = _trace(name)
    dot = parse(trace.to_dot())
    ops = {op.label for op in trace}
    assert ops | set(trace.input_labels) <= set(dot.nodes)
    outputs = [n for n in dot.nodes if n.startswith("output ")]
    assert len(outputs) == len(trace.output_labels)
    expected = set()
    for op in trace:
        for parent in op.parents:
            record = trace[parent]
            if parent in ops or record.kind == "input":
                expected.add((parent, op.label))
    drawn = set(dot.edges)
    assert expected <= drawn
    for i, label in enumerate(trace.output_labels, start=1):
        assert (label, f"output {i}") in drawn
    # folded parameters are text in their reader, not nodes
    assert not set(trace.parameters) & set(dot.nodes) - set(trace.output_labels)
    assert len(drawn) == len(dot.edges), "edges are drawn once each"


@pytest.mark.parametrize("name", STRUCTURE_CASES)
def test_multi_op_module_calls_are_nested_clusters(name):
    trace = _trace(name)
    dot = parse(trace.to_dot())
    calls = _calls(trace)
    for key, call in calls.items():
        cluster = f"{key[0]}:{key[1]}"
        assert (cluster in dot.clusters) == (len(call.ops) > 1), cluster
    for op in trace:
        clustered = [f"{a}:{c}" for a, c in op.module_stack if len(calls[a, c].ops) > 1]
        assert dot.nodes[op.label] == tuple(clustered), op.label
        if len(clustered) < len(op.module_stack):  # a one-op call is named inside the node
            address = op.module_stack[len(clustered)][0].rpartition(".")[2]
            assert address in dot.attrs[op.label]


def test_node_shows_function_label_and_shape():
    trace = _trace("transformer_encoder_layer")
    attrs = parse(trace.to_dot()).attrs["linear_3"]  # linear_1, _2: attention projections
    assert "<B>linear_3</B>" in attrs
    assert "(2, 5, 32)" in attrs
    assert "linear1 (Linear)" in attrs
    assert "weight (32, 16)" in attrs and "bias (32)" in attrs  # folded parameters
    assert "shape=" not in attrs  # op nodes use the default box
    assert 'shape="oval"' in parse(trace.to_dot()).attrs["input_1"]


def test_inputs_outputs_and_parameters_look_different():
    dot = parse(_trace("mlp_tiny").to_dot(params="nodes"))
    styles = {n: dot.attrs[n].split(", tooltip")[0] for n in ("input_1", "output 1", "fc1.weight")}
    styles["op"] = dot.attrs["relu_1"].split(", tooltip")[0]
    assert len(set(styles.values())) == 4
    assert ("fc1.weight", "linear_1") in dot.edges


def test_params_hide_leaves_them_out():
    trace = _trace("mlp_tiny")
    text = trace.to_dot(params="hide")
    assert "fc1.weight" not in parse(text).nodes and "weight (16, 8)" not in text


def test_returned_parameter_gets_a_node():
    trace = _trace("returns_parameter")
    dot = parse(trace.to_dot())
    assert "extra" in dot.nodes and "const" in dot.nodes
    assert ("extra", "output 2") in dot.edges and ("const", "output 3") in dot.edges


def test_dot_is_deterministic():
    first = _trace("transformer_encoder_layer")
    second = _trace("transformer_encoder_layer")
    assert first.to_dot() == first.to_dot() == second.to_dot()
    assert first.to_dot(depth=1, collapse_repeats=True) == second.to_dot(
        depth=1, collapse_repeats=True
    )


def test_function_and_method_agree():
    trace = _trace("mlp_tiny")
    assert to_dot(trace, depth=0) == trace.to_dot(depth=0)


# -- depth ---------------------------------------------------------------------------------
def test_depth_collapses_module_calls_and_reroutes_edges():
    trace = _trace("transformer_encoder_layer")
    full, one, zero = (parse(trace.to_dot(depth=d)) for d in (None, 1, 0))
    assert len(zero.nodes) < len(one.nodes) < len(full.nodes)
    assert set(zero.clusters) == set()
    assert set(one.clusters) == {"layer:1"}
    assert "module layer.self_attn:1" in one.nodes
    assert one.nodes["module layer.self_attn:1"] == ("layer:1",)
    assert ("module layer.self_attn:1", "dropout_1") in one.edges
    assert ("input_1", "module layer.self_attn:1") in one.edges
    # depth 0: the whole layer is one node between the input and the pooling op
    assert {("input_1", "module layer:1"), ("module layer:1", "mean_1")} <= set(zero.edges)
    assert not any(a == b for a, b in zero.edges)
    assert "35 ops" in zero.attrs["module layer:1"]  # attention opened: 23 ops inside it


def test_bad_options_are_refused():
    trace = _trace("mlp_tiny")
    with pytest.raises(InvalidArgumentError) as err:
        trace.to_dot(depth=-1)
    assert err.value.code == "bad_depth"
    with pytest.raises(InvalidArgumentError) as err:
        trace.to_dot(params="inline")
    assert err.value.code == "bad_option"


# -- repeated blocks -------------------------------------------------------------------------
class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return x + self.fc(self.norm(x)).relu()


class _Stack(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 8)
        self.blocks = nn.Sequential(*[_Block() for _ in range(n)])
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        return self.head(self.blocks(self.embed(x)))


def test_repeated_blocks_fold_into_one_with_a_count():
    trace = tl.trace(_Stack(12).eval(), torch.randn(2, 4))
    repeats = find_repeats(trace)
    assert [(r.module_type, r.count) for r in repeats] == [("_Block", 12)]
    full, folded = parse(trace.to_dot()), parse(trace.to_dot(collapse_repeats=True))
    assert len([c for c in full.clusters if c.startswith("blocks.")]) == 12
    assert [c for c in folded.clusters if c.startswith("blocks.")] == ["blocks.0:1"]
    assert "x12" in folded.attrs.get("blocks.0:1", "") or "x12" in trace.to_dot(
        collapse_repeats=True
    )
    assert len(folded.nodes) < len(full.nodes) / 5
    # the embedding feeds the first block; the last block's output feeds the head via block 0
    first_block_ops = trace.module_calls("blocks.0")[0].ops
    assert ("linear_1", first_block_ops[0]) in folded.edges
    assert (first_block_ops[-1], "linear_14") in folded.edges  # embed, 12 block fcs, head
    assert not any(b == first_block_ops[0] and a == first_block_ops[-1] for a, b in folded.edges)


def test_repeats_fold_at_a_depth_too():
    trace = tl.trace(_Stack(3).eval(), torch.randn(2, 4))
    dot = parse(trace.to_dot(depth=1, collapse_repeats=True))
    assert "module blocks.0:1" in dot.nodes
    assert "module blocks.1:1" not in dot.nodes
    assert "x3" in dot.attrs["module blocks.0:1"]


def test_branches_are_not_folded():
    trace = _trace("cat_stack")  # two identical Linear calls on different inputs
    assert find_repeats(trace) == []


def test_zoo_residual_blocks_fold():
    trace = _trace("residual_blocks")
    dot = parse(trace.to_dot(collapse_repeats=True))
    assert "blocks.0:1" in dot.clusters and "blocks.1:1" not in dot.clusters


# -- rendering -------------------------------------------------------------------------------
@needs_dot
def test_draw_writes_a_real_svg(tmp_path):
    trace = _trace("transformer_encoder_layer")
    out = trace.draw(tmp_path / "graph.svg")
    text = out.read_text()
    assert out == tmp_path / "graph.svg"
    assert "<svg" in text and "</svg>" in text
    assert "layer_norm_1" in text and "TransformerEncoderLayer" in text
    assert text.count('class="cluster"') == len(parse(trace.to_dot()).clusters)


@needs_dot
def test_draw_png_and_pdf_by_suffix(tmp_path):
    trace = _trace("mlp_tiny")
    assert draw(trace, tmp_path / "g.png").read_bytes().startswith(b"\x89PNG")
    assert draw(trace, tmp_path / "g.pdf").read_bytes().startswith(b"%PDF")
    assert draw(trace, tmp_path / "g.out", format="svg").read_text().count("<svg") == 1


def test_draw_refuses_unknown_format(tmp_path):
    with pytest.raises(InvalidArgumentError) as err:
        _trace("mlp_tiny").draw(tmp_path / "graph.jpg2")
    assert err.value.code == "bad_format"


def test_draw_without_dot_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no `dot` anywhere
    trace = _trace("mlp_tiny")
    with pytest.raises(GraphvizMissingError) as err:
        trace.draw(tmp_path / "graph.svg")
    assert err.value.code == "graphviz_missing"
    assert "apt-get install graphviz" in str(err.value) and "brew" in str(err.value)
    assert not (tmp_path / "graph.svg").exists()
    assert '"linear_1" -> "relu_1"' in trace.to_dot()  # DOT text still works


# -- notebook tables -------------------------------------------------------------------------
class _Oddly(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.add_module("<b>x&y", nn.Linear(4, 4))

    def forward(self, x):
        return getattr(self, "<b>x&y")(x).relu()


def test_html_tables_escape_everything():
    trace = tl.trace(_Oddly(), torch.randn(2, 4))
    html = trace._repr_html_()
    assert "<table" in html and "linear_1" in html and "relu_1" in html
    assert "<b>x&y" not in html and "&lt;b&gt;x&amp;y" in html
    op_html = trace["linear_1"]._repr_html_()
    assert "&lt;b&gt;x&amp;y:1" in op_html and "relu_1" in op_html  # module call, child
    assert "<b>x" not in op_html.replace("<b>Op</b>", "")
    labels = [attrs.partition("label=")[2] for attrs in parse(trace.to_dot()).attrs.values()]
    assert any("&lt;b&gt;x&amp;y" in label for label in labels)
    assert not any("<b>x&y" in label for label in labels)  # DOT's HTML labels are escaped


@needs_dot
def test_svg_of_odd_names_is_well_formed_xml(tmp_path):
    import xml.etree.ElementTree as ET

    trace = tl.trace(_Oddly(), torch.randn(2, 4))
    root = ET.parse(trace.draw(tmp_path / "odd.svg")).getroot()
    texts = " ".join(t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text"))
    assert "<b>x&y (Linear)" in texts


def test_html_table_is_compact_for_long_traces():
    trace = tl.trace(_Stack(12).eval(), torch.randn(2, 4))
    html = trace._repr_html_()
    assert html.count("<tr>") < 45 < len(trace)
    assert f"{len(trace)} ops" in html and "more ops" in html
    assert trace.ops[0].label in html and trace.ops[-1].label in html
