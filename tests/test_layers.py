"""Layers and passes (torchlens/layers.py, docs/loops.md): the same code run again is one
layer, each run a pass; different code never merges. Each class of repetition both ways."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.errors import InvalidArgumentError, LookupFailedError

try:
    from tests import _tiny_llms as llms
    from tests.models import ZOO, CellLoop, HandRNN, RepeatedModule
except ImportError:  # run from tests/
    import _tiny_llms as llms
    from models import ZOO, CellLoop, HandRNN, RepeatedModule


def layers_of(trace: tl.Trace) -> dict[str, list[str]]:
    return {name: [op.label for op in ops] for name, ops in trace.layers.items()}


def passes_of(trace: tl.Trace) -> dict[str, int]:
    return {name: len(ops) for name, ops in trace.layers.items()}


class LoopRNN(nn.Module):
    """A Python loop over one RNNCell, with weight-free ops in the loop body."""

    def __init__(self, steps: int = 5) -> None:
        super().__init__()
        self.steps = steps
        self.cell = nn.RNNCell(4, 8)
        self.out = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.zeros(x.shape[0], 8)
        for t in range(self.steps):
            h = self.cell(x[:, t], h)
            h = h * 0.5 + 1.0
        return self.out(h)


class Cell(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ih, self.hh = nn.Linear(4, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.ih(x) + self.hh(h))


class Unrolled(nn.Module):
    """A hand-written RNN cell unrolled in Python, its output read at each step."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = Cell()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, outs = torch.zeros(x.shape[0], 8), []
        for t in range(x.shape[1]):
            h = self.cell(x[:, t], h)
            outs.append(h.sum(-1))
        return torch.stack(outs, 1)


class Siamese(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 4))

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (self.encoder(a) - self.encoder(b)).norm(dim=-1)


class TwoLinears(nn.Module):
    """Two modules of one class, with different weights, in a loop over a ModuleList."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 8)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


class WrittenTwice(nn.Module):
    """The same functions at two places of the forward, no loop."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(x)
        x = x * 2
        x = torch.relu(x)
        return x * 2


class SharedThenWrittenTwice(nn.Module):
    """A module applied twice, relu written after each use at two different lines."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.fc(x)
        x = torch.relu(x)
        x = self.fc(x)
        x = torch.relu(x)
        return x


# -- each class of repetition ---------------------------------------------------------------
def test_python_loop_over_a_cell_gives_one_layer_per_op_of_the_body():
    trace = tl.trace(LoopRNN(5), torch.randn(2, 5, 4))
    assert layers_of(trace) == {
        "zeros_1": ["zeros_1"],
        "getitem_1": [f"getitem_{k}" for k in range(1, 6)],  # x[:, t], weight-free
        "rnn_tanh_cell_1": [f"rnn_tanh_cell_{k}" for k in range(1, 6)],
        "mul_1": [f"mul_{k}" for k in range(1, 6)],
        "add_1": [f"add_{k}" for k in range(1, 6)],
        "linear_1": ["linear_1"],
    }
    op = trace["mul_3"]
    assert (op.layer, op.pass_index) == ("mul_1", 3)
    assert trace["mul_1:3"] is op and trace["rnn_tanh_cell_1:5"] is trace["rnn_tanh_cell_5"]
    assert trace["zeros_1"].pass_index == 1 and trace["zeros_1:1"] is trace["zeros_1"]


def test_rnn_cell_unrolled_in_python_nested_ops_and_step_outputs():
    trace = tl.trace(Unrolled(), torch.randn(3, 4, 4))
    passes = passes_of(trace)
    for name in ("linear_1", "linear_2", "add_1", "tanh_1", "sum_1", "getitem_1"):
        assert passes[name] == 4, (name, passes)
    assert passes["stack_1"] == 1 and passes["zeros_1"] == 1
    # "the cell's output at step 3" has a name
    assert trace["tanh_1:3"].label == "tanh_3"
    assert trace["tanh_1:3"].parents[0] == "add_3"
    assert [op.pass_index for op in trace.layers["linear_2"]] == [1, 2, 3, 4]


def test_held_out_recurrences_of_the_zoo():
    loop = tl.trace(CellLoop(), torch.randn(6, 2, 4))
    counts = set(passes_of(loop).values())
    assert counts == {1, 6}
    assert [len(loop.layers[op.layer]) for op in loop if op.module.startswith(("cell", "gru"))]
    for op in loop:
        inside = op.module in ("cell", "gru", "head") or op.func_name == "getitem"
        assert len(loop.layers[op.layer]) == (6 if inside else 1), op.label
    hand = tl.trace(HandRNN(), torch.randn(2, 7, 4))
    assert {n: p for n, p in passes_of(hand).items() if p > 1} == {
        "getitem_1": 7, "linear_1": 7, "linear_2": 7, "add_1": 7, "tanh_1": 7,
    }  # fmt: skip
    repeated = tl.trace(RepeatedModule(), torch.randn(2, 8))
    assert passes_of(repeated) == {"linear_1": 4, "tanh_1": 3, "add_1": 1}


def test_module_applied_twice_siamese():
    trace = tl.trace(Siamese(), torch.randn(2, 6), kwargs={"b": torch.randn(2, 6)})
    assert layers_of(trace) == {
        "linear_1": ["linear_1", "linear_3"],
        "relu_1": ["relu_1", "relu_2"],
        "linear_2": ["linear_2", "linear_4"],
        "sub_1": ["sub_1"],
        "norm_1": ["norm_1"],
    }


def test_albert_shares_one_layer_across_depth():
    model = llms.build(
        "AlbertModel", "AlbertConfig", vocab_size=llms.VOCAB, embedding_size=16, hidden_size=32,
        num_hidden_layers=3, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=32,
    )  # fmt: skip
    trace = tl.trace(model, llms.ids(0, 6))
    shared = "encoder.albert_layer_groups.0.albert_layers.0"
    inside = [op for op in trace if op.module.startswith(shared)]
    assert inside
    for op in inside:
        assert len(trace.layers[op.layer]) == 3, op.label
        step = dict(op.module_stack)[shared]
        assert op.pass_index == step
    outside = [op for op in trace if not op.module.startswith(shared) and "albert" not in op.module]
    assert all(len(trace.layers[op.layer]) == 1 for op in outside if op.module)


def test_generate_steps_are_passes():
    model = llms.gpt2_lm()
    options = {"max_new_tokens": 3, "do_sample": False, "pad_token_id": 0}
    trace = tl.trace(model.generate, llms.ids(1, 5), kwargs=options)
    steps = [op for op in trace if op.module_stack and op.module_stack[0][0] == ""]
    assert steps
    prefill_only = 0
    for op in steps:  # every op of the model's forward: one pass per decoding step
        step, passes = op.module_stack[0][1], len(trace.layers[op.layer])
        if passes == 1:  # code only the first step runs (the prompt's cache set-up)
            assert step == 1, op.label
            prefill_only += 1
        else:
            assert (passes, op.pass_index) == (3, step), op.label
    assert prefill_only < len(steps) / 20
    lm_head = [op for op in trace if op.module == "lm_head"]
    assert [op.layer for op in lm_head] == [lm_head[0].label] * 3
    # the sampling code between steps lines up too: argmax once per step
    argmax = [op for op in trace if op.func_name == "argmax"]
    assert [(op.layer, op.pass_index) for op in argmax] == [("argmax_1", k) for k in (1, 2, 3)]


class Denoiser(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(5, 16), nn.SiLU(), nn.Linear(16, 4))

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([x, t.expand(x.shape[0], 1)], -1))


def test_sampling_loop_steps_are_passes():
    denoiser = Denoiser()

    def sample(x: torch.Tensor) -> torch.Tensor:
        for step in range(6):
            t = torch.full((1, 1), 1.0 - step / 6)
            eps = denoiser(x, t)
            x = x - 0.1 * eps
        return x

    trace = tl.trace(sample, torch.randn(3, 4), root=denoiser)
    passes = passes_of(trace)
    assert set(passes.values()) == {6}, passes
    assert trace["sub_1:6"].label == trace.output_labels[0]


# -- what never merges ------------------------------------------------------------------------
def test_two_modules_of_one_class_never_merge():
    trace = tl.trace(TwoLinears(), torch.randn(2, 8))
    assert passes_of(trace) == {"linear_1": 1, "relu_1": 1, "linear_2": 1, "relu_2": 1}
    stacked = tl.trace(nn.Sequential(*[nn.Linear(4, 4) for _ in range(4)]), torch.randn(1, 4))
    assert set(passes_of(stacked).values()) == {1} and len(stacked.layers) == 4


def test_the_same_function_at_two_places_never_merges():
    trace = tl.trace(WrittenTwice(), torch.randn(2, 3))
    assert passes_of(trace) == {"relu_1": 1, "mul_1": 1, "relu_2": 1, "mul_2": 1}
    # a module applied twice merges; the relus after it are two lines of code: with source
    # lines they stay apart, without them they are the same record as a two-step loop
    with_lines = tl.trace(SharedThenWrittenTwice(), torch.randn(2, 8), source=True)
    assert passes_of(with_lines) == {"linear_1": 2, "relu_1": 1, "relu_2": 1}
    without = tl.trace(SharedThenWrittenTwice(), torch.randn(2, 8))
    assert passes_of(without) == {"linear_1": 2, "relu_1": 2}


def test_source_lines_fold_a_weight_free_loop():
    def loop(x: torch.Tensor) -> torch.Tensor:
        for _ in range(4):
            x = torch.sin(x) + 1
        return x

    plain = tl.trace(loop, torch.randn(3))
    assert set(passes_of(plain).values()) == {1}  # nothing marks the loop
    lined = tl.trace(loop, torch.randn(3), source=True)
    assert passes_of(lined) == {"sin_1": 4, "add_1": 4}


@pytest.mark.parametrize("case", [c for c in ZOO if not c.train], ids=lambda c: c.name)
def test_zoo_layers_are_consistent_and_one_pass_without_reuse(case):
    args, kwargs = case.make_inputs()
    torch.manual_seed(0)
    trace = tl.trace(case.make_model(), args, kwargs)
    again = tl.trace(case.make_model(), args, kwargs)
    assert layers_of(trace) == layers_of(again)  # deterministic
    seen = []
    for name, ops in trace.layers.items():
        assert ops[0].label == name
        assert len({(op.func_name, op.output_index) for op in ops}) == 1
        assert [op.pass_index for op in ops] == list(range(1, len(ops) + 1))
        assert [op.index for op in ops] == sorted(op.index for op in ops)
        seen += [op.label for op in ops]
    assert sorted(seen) == sorted(trace.labels)  # every op in exactly one layer
    calls = [m.address for m in trace.modules[1:]]
    reads = [p for op in trace for p in op.parents if p in trace.parameters or p in trace.buffers]
    reused = len(set(calls)) < len(calls) or len(set(reads)) < len(reads)
    if not reused:  # nothing ran twice: every op is a layer of one pass
        assert trace.layers.repeated == {}, trace.layers.repeated


# -- API --------------------------------------------------------------------------------------
def test_lookup_errors_and_dead_traces():
    trace = tl.trace(LoopRNN(3), torch.randn(2, 3, 4))
    with pytest.raises(LookupFailedError) as err:
        trace["mul_1:4"]
    assert err.value.code == "not_found" and "3 pass(es)" in str(err.value)
    with pytest.raises(LookupFailedError):
        trace["nothing_1:1"]
    assert trace.layers.find("relu") is None and trace.layers.find("mul_9:1") is None
    with pytest.raises(LookupFailedError):
        trace.layers["mul_2"]  # an op label, but not a layer's: layers go by their first op
    op = trace["mul_2"]
    del trace
    import gc

    gc.collect()
    with pytest.raises(LookupFailedError) as err:
        op.layer
    assert err.value.code == "not_found"


def test_layer_selector_every_pass_one_pass_a_range():
    trace = tl.trace(LoopRNN(5), torch.randn(2, 5, 4))

    def picked(sel):
        return [op.label for op in trace if sel(op)]

    assert picked(tl.layer("mul_1")) == [f"mul_{k}" for k in range(1, 6)]
    assert picked(tl.layer("mul_1", passes=2)) == ["mul_2"]
    assert picked(tl.layer("mul_1:4")) == ["mul_4"]
    assert picked(tl.layer("mul_1", "add_1", passes=range(4, 6))) == [
        "mul_4", "add_4", "mul_5", "add_5",
    ]  # fmt: skip
    assert picked(tl.layer("mul_1") & ~tl.layer("mul_1", passes=[1, 2])) == ["mul_3", "mul_4",
                                                                            "mul_5"]  # fmt: skip
    assert "mul_2" in trace.summary(tl.layer("mul_1", passes=2))
    assert "mul_3" not in trace.summary(tl.layer("mul_1", passes=2))
    for bad in (lambda: tl.layer(), lambda: tl.layer("mul_1", passes=0),
                lambda: tl.layer("mul_1:2", passes=1), lambda: tl.layer("a:1", "b"),
                lambda: tl.layer("mul_1", passes=[])):  # fmt: skip
        with pytest.raises(InvalidArgumentError) as err:
            bad()
        assert err.value.code == "bad_selector"


def test_layer_selector_during_a_capture_says_to_use_a_trace():
    with pytest.raises(InvalidArgumentError) as err:
        tl.trace(LoopRNN(2), torch.randn(2, 2, 4), save=tl.layer("mul_1"))
    assert err.value.code == "layer_needs_trace"


def test_rerun_edits_one_pass():
    trace = tl.trace(LoopRNN(4), torch.randn(2, 4, 4))
    edited = trace.rerun({tl.layer("mul_1", passes=3): lambda t, op: t * 0})
    assert torch.equal(edited["mul_3"].out, torch.zeros_like(edited["mul_3"].out))
    assert torch.equal(edited["mul_2"].out, trace["mul_2"].out)
    assert not torch.equal(edited.output, trace.output)


def test_summary_shows_layers_with_pass_counts():
    text = str(tl.trace(LoopRNN(3), torch.randn(2, 3, 4)))
    assert "layers: 6, 4 run more than once (passes): getitem_1 x3, rnn_tanh_cell_1 x3" in text
    assert "layer:pass" in text.splitlines()[1]
    assert text.splitlines()[-1].startswith("layers: 6, 4 run more than once")
    trace = tl.trace(LoopRNN(3), torch.randn(2, 3, 4))
    filtered = trace.summary(tl.func("mul"))
    assert "run more than once" not in filtered and "mul_1:3/3" in filtered
    row = next(line for line in text.splitlines() if line.startswith("mul_2 "))
    assert row.rstrip().endswith("mul_1:2/3")
    plain = str(tl.trace(nn.Sequential(nn.Linear(4, 3), nn.ReLU()), torch.randn(2, 4)))
    assert "layer:pass" not in plain and "layers:" not in plain


def test_save_and_load_keep_the_layers(tmp_path):
    trace = tl.trace(Unrolled(), torch.randn(2, 4, 4), source=True)
    loaded = tl.load(trace.save(tmp_path / "t"))
    assert layers_of(loaded) == layers_of(trace)
    assert loaded["tanh_1:2"].label == "tanh_2" and loaded["tanh_2"].pass_index == 2


def test_layers_are_grouped_after_capture_not_during_it():
    trace = tl.trace(LoopRNN(3), torch.randn(2, 3, 4))
    assert trace._layers is None  # nothing computed until asked
    assert trace["mul_2"].layer == "mul_1" and trace._layers is not None


def test_extract_sites_by_layer_and_pass(tmp_path):
    model = LoopRNN(4).eval()
    batches = [torch.randn(3, 4, 4) for _ in range(2)]
    sel = tl.layer("rnn_tanh_cell_1", passes=[2, 4]) | tl.func("linear")
    ex = tl.extract(model, batches, save=sel, to=tmp_path / "run", progress=False)
    assert sorted(ex) == ["linear_1", "rnn_tanh_cell_1:2", "rnn_tanh_cell_1:4"]
    trace = tl.trace(model, batches[1])
    assert torch.allclose(ex["rnn_tanh_cell_1:4"][3:6], trace["rnn_tanh_cell_1:4"].out)
    with pytest.raises(tl.errors.SelectorMatchError) as err:
        tl.extract(model, batches, save=tl.layer("mull_1"), to=tmp_path / "r2", progress=False)
    assert err.value.code == "no_match" and "mul_1" in str(err.value)


# -- the rolled drawing -----------------------------------------------------------------------
def test_rolled_drawing_of_a_20_step_loop_is_the_size_of_its_body():
    trace = tl.trace(LoopRNN(20), torch.randn(2, 20, 4))
    rolled = tl.viz.graph.build_view(trace, rolled=True)
    full = tl.viz.graph.build_view(trace)
    assert len(full.nodes) > 80
    ops = [n for n in rolled.nodes.values() if n.kind in ("op", "layout")]
    assert [n.id for n in ops] == ["zeros_1", "getitem_1", "rnn_tanh_cell_1", "mul_1", "add_1",
                                   "linear_1"]  # fmt: skip
    assert rolled.nodes["mul_1"].lines[-1] == "x20 passes"
    assert rolled.edge_labels == {
        ("zeros_1", "rnn_tanh_cell_1"): "into pass 1",
        ("add_1", "rnn_tanh_cell_1"): "1→2 … 19→20",
        ("add_1", "linear_1"): "pass 20",
    }
    dot = trace.to_dot(rolled=True)
    assert 'label="1→2 … 19→20"' in dot and "x20 passes" in dot
    with pytest.raises(InvalidArgumentError) as err:
        trace.to_dot(rolled=True, collapse_repeats=True)
    assert err.value.code == "bad_option"


def test_rolled_module_clusters_are_drawn_once():
    trace = tl.trace(Unrolled(), torch.randn(2, 6, 4))
    dot = trace.to_dot(rolled=True)
    assert dot.count("subgraph") == 1 and "<B>cell (Cell)</B>" in dot and "x6 calls" in dot
    assert '"linear_2" [' in dot and '"tanh_1" [' in dot  # first passes: ih, hh, tanh
    assert '"linear_3"' not in dot and '"tanh_2"' not in dot  # later passes are not drawn


def test_rolled_png_renders(tmp_path):
    pytest.importorskip("graphviz")
    import shutil

    if shutil.which("dot") is None:
        pytest.skip("no Graphviz dot")
    trace = tl.trace(LoopRNN(20), torch.randn(2, 20, 4))
    path = trace.draw(tmp_path / "rolled.png", rolled=True)
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_viewer_data_marks_passes_for_the_rolled_view():
    from torchlens.viz._viewer_data import viewer_data

    trace = tl.trace(LoopRNN(3), torch.randn(2, 3, 4))
    data = viewer_data(trace, use_dot=False)
    nodes = {n["id"]: n for n in data["nodes"]}
    assert data["repeated"] == 4
    assert nodes["mul_1"]["np"] == 3 and "L" not in nodes["mul_1"]
    assert (
        nodes["mul_3"]["lp"] == "mul_1:3/3" and data["nodes"][nodes["mul_3"]["L"]]["id"] == "mul_1"
    )
    assert "lp" not in nodes["linear_1"]
    html = tl.viz.viewer_html(trace, rolled=True)
    assert '"start_rolled":true' in html and 'id="roll"' in html


def test_a_rolled_drawing_fits_where_the_unrolled_one_is_folded():
    import warnings

    from torchlens.viz.readable import DrawingSizeWarning, readable_options

    trace = tl.trace(LoopRNN(60), torch.randn(2, 60, 4))
    with warnings.catch_warnings():
        warnings.simplefilter("error", DrawingSizeWarning)
        assert readable_options(trace, "auto", False, "fold", 150, rolled=True) == (None, False)
    with pytest.warns(DrawingSizeWarning, match="collapse_repeats=True"):
        readable_options(trace, "auto", False, "fold", 150)


class InnerSteps(nn.Module):
    """An outer loop over time steps, an inner one calling the same cell three times."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.zeros(2, 8)
        for t in range(x.shape[1]):
            h = h + x[:, t]
            for _ in range(3):
                h = self.cell(h)
            h = torch.tanh(h)
        return h.sum()


def test_a_cell_called_several_times_per_step_lines_up_by_phase():
    trace = tl.trace(InnerSteps(), torch.randn(2, 5, 8))
    assert passes_of(trace) == {
        "zeros_1": 1, "getitem_1": 5, "add_1": 5, "linear_1": 15, "tanh_1": 5, "sum_1": 1,
    }  # fmt: skip
    assert [op.label for op in trace.layers["tanh_1"]] == [f"tanh_{k}" for k in range(1, 6)]


class CORblock(nn.Module):
    """CORnet-S style: shared convs run for T steps, a norm of its own at each step."""

    def __init__(self, times: int = 3) -> None:
        super().__init__()
        self.times = times
        self.conv_input = nn.Conv2d(3, 8, 1)
        self.conv1, self.conv2 = nn.Conv2d(8, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)
        self.nonlin = nn.ReLU()
        for t in range(times):
            setattr(self, f"norm1_{t}", nn.BatchNorm2d(8))
            setattr(self, f"norm2_{t}", nn.BatchNorm2d(8))

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        x = self.conv_input(inp)
        for t in range(self.times):
            skip = x
            x = self.nonlin(getattr(self, f"norm1_{t}")(self.conv1(x)))
            x = getattr(self, f"norm2_{t}")(self.conv2(x))
            x = x + skip
            x = torch.relu(x) * 0.5
        return x.mean()


def test_corblock_steps_with_their_own_norms():
    trace = tl.trace(CORblock().eval(), torch.randn(1, 3, 6, 6))
    passes = passes_of(trace)
    assert passes["conv2d_2"] == 3 and passes["conv2d_3"] == 3  # the shared convs
    assert passes["add_1"] == 3 and passes["relu_2"] == 3 and passes["mul_1"] == 3
    norms = [op for op in trace if op.func_name == "batch_norm"]
    assert len(norms) == 6 and all(len(trace.layers[op.layer]) == 1 for op in norms)


# -- every op's layer and pass, pinned -------------------------------------------------------
# "." is an op that is the first pass of its own layer; the grouping may get faster, never
# different (benchmarks/bench_layers.py times it)
PINNED = {
    "loop": (
        lambda: tl.trace(LoopRNN(3), torch.randn(2, 3, 4)),
        ". . . . . getitem_1:2 rnn_tanh_cell_1:2 mul_1:2 add_1:2 getitem_1:3 rnn_tanh_cell_1:3"
        " mul_1:3 add_1:3 .",
    ),
    "unrolled": (
        lambda: tl.trace(Unrolled(), torch.randn(2, 3, 4)),
        ". . . . . . . getitem_1:2 linear_1:2 linear_2:2 add_1:2 tanh_1:2 sum_1:2 getitem_1:3"
        " linear_1:3 linear_2:3 add_1:3 tanh_1:3 sum_1:3 .",
    ),
    "siamese": (
        lambda: tl.trace(Siamese(), torch.randn(2, 6), kwargs={"b": torch.randn(2, 6)}),
        ". . . linear_1:2 relu_1:2 linear_2:2 . .",
    ),
    "source_lines": (
        lambda: tl.trace(SharedThenWrittenTwice(), torch.randn(2, 8), source=True),
        ". . linear_1:2 .",
    ),
    "inner_steps": (
        lambda: tl.trace(InnerSteps(), torch.randn(2, 2, 8)),
        ". . . . linear_1:2 linear_1:3 . . . linear_1:4 linear_1:5 linear_1:6 . .",
    ),
    "corblock": (
        lambda: tl.trace(CORblock(times=2).eval(), torch.randn(1, 3, 6, 6)),
        ". . . . . . . . . conv2d_2:2 . relu_1:2 conv2d_3:2 . add_1:2 relu_2:2 mul_1:2 .",
    ),
}


@pytest.mark.parametrize("name", PINNED)
def test_every_op_keeps_its_layer_and_pass(name):
    make, expected = PINNED[name]
    trace = make()
    got = [
        "." if (op.layer, op.pass_index) == (op.label, 1) else f"{op.layer}:{op.pass_index}"
        for op in trace
    ]
    assert got == expected.split()
