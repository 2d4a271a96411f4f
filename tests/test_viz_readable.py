"""Big drawings get a readable default; collapsed modules count parameters and buffers apart."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import torchlens as tl
import torchlens.viz.render as render
from tests._tiny_llms import build
from torchlens.errors import InvalidArgumentError
from torchlens.viz import DrawingSizeWarning
from torchlens.viz.graph import build_view
from torchlens.viz.readable import MAX_NODES, MAX_ROWS, rows


class Stage(nn.Module):
    """Stages of different widths: nothing repeats, so only a depth can shrink the picture."""

    def __init__(self, width: int):
        super().__init__()
        self.fc = nn.Linear(width, width + 1)
        self.norm = nn.LayerNorm(width + 1)

    def forward(self, x):
        for _ in range(4):
            x = torch.tanh(x) * 0.5 + x
        return torch.relu(self.norm(self.fc(x)))


def _big_model() -> nn.Module:
    return nn.Sequential(*[Stage(4 + i) for i in range(12)])


@pytest.fixture
def drawn(monkeypatch):
    """The DOT text each draw() would have rendered (no Graphviz needed)."""
    texts: list[str] = []

    def fake_render(text: str, fmt: str) -> bytes:
        texts.append(text)
        return b"<svg/>"

    monkeypatch.setattr(render, "render_dot", fake_render)
    return texts


def test_a_big_graph_is_drawn_readable_with_one_line_saying_how_to_get_all(drawn, tmp_path):
    trace = tl.trace(_big_model(), torch.randn(2, 4))
    assert len(trace) > 150
    with pytest.warns(DrawingSizeWarning) as caught:
        trace.draw(tmp_path / "g.svg")
    (warning,) = caught
    message = str(warning.message)
    assert "depth=0" in message and "max_nodes=None" in message
    assert warning.filename == __file__  # points at the user's draw call
    assert drawn[-1] == trace.to_dot(depth=0, collapse_repeats=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trace.draw(tmp_path / "g.svg", max_nodes=None)  # the full graph, silently
        assert drawn[-1] == trace.to_dot()
        trace.draw(tmp_path / "g.svg", depth=1)  # an explicit choice is kept
        assert drawn[-1] == trace.to_dot(depth=1)


def test_repeated_blocks_are_folded_before_any_depth_is_chosen(drawn, tmp_path):
    model = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(100)])
    trace = tl.trace(model, torch.randn(2, 8))
    with pytest.warns(DrawingSizeWarning, match="collapse_repeats=True \\("):
        tl.viz.draw(trace, tmp_path / "g.svg")
    assert drawn[-1] == trace.to_dot(collapse_repeats=True)


def test_small_graphs_are_drawn_in_full_and_max_nodes_is_checked(drawn, tmp_path):
    trace = tl.trace(nn.Sequential(nn.Linear(4, 3), nn.ReLU()), torch.randn(2, 4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trace.draw(tmp_path / "g.svg")
    assert drawn[-1] == trace.to_dot()
    with pytest.raises(InvalidArgumentError) as info:
        trace.draw(tmp_path / "g.svg", max_nodes=0)
    assert info.value.code == "bad_option"


def test_collapsed_modules_count_parameters_and_buffers_apart():
    model = nn.Sequential(
        nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4))
    ).eval()
    text = tl.trace(model, torch.randn(1, 3, 8, 8)).to_dot(depth=0)
    # 2 conv weights + 2 conv biases + 2 bn weights + 2 bn biases; 2 x (mean, var)
    assert "8 parameters, " in text and "4 buffers, 16 values" in text
    assert "param tensors" not in text


def test_a_strip_far_taller_than_a_screen_is_drawn_readable_though_it_has_few_boxes(
    drawn, tmp_path
):
    trace = tl.trace(nn.Sequential(*[nn.Tanh() for _ in range(60)]), torch.randn(2, 3))
    full = build_view(trace)
    assert len(full.nodes) <= MAX_NODES and rows(full) == 62 > MAX_ROWS  # input, 60, output
    with pytest.warns(DrawingSizeWarning) as caught:
        trace.draw(tmp_path / "g.svg")
    (message,) = [str(w.message) for w in caught]
    assert "\n" not in message and "62 rows" in message and "depth=None" in message
    assert drawn[-1] == trace.to_dot(collapse_repeats=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trace.draw(tmp_path / "g.svg", depth=None)  # explicitly everything, silently
        assert drawn[-1] == trace.to_dot()
    with pytest.raises(InvalidArgumentError) as info:
        trace.draw(tmp_path / "g.svg", depth="deep")
    assert info.value.code == "bad_depth"


def test_a_two_layer_gpt2_is_drawn_at_a_readable_depth(drawn, tmp_path):
    model = build(
        "GPT2LMHeadModel", "GPT2Config", n_layer=2, n_embd=64, n_head=4, n_positions=64,
        vocab_size=100, bos_token_id=0, eos_token_id=0, attn_implementation="sdpa",
    )  # fmt: skip
    trace = tl.trace(model, torch.randint(0, 100, (1, 16)))
    full = build_view(trace)
    assert len(full.nodes) <= MAX_NODES < 2 * len(full.nodes)  # not too many boxes ...
    assert rows(full) > 2 * MAX_ROWS  # ... but a strip over twice as tall as readable
    with pytest.warns(DrawingSizeWarning, match="depth=3 .*depth=None"):
        trace.draw(tmp_path / "gpt2.svg")
    assert drawn[-1] == trace.to_dot(depth=3, collapse_repeats=True)
    assert rows(build_view(trace, 3, True)) <= MAX_ROWS < rows(build_view(trace, None, True))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trace.draw(tmp_path / "gpt2.svg", depth=None)
        assert drawn[-1] == trace.to_dot()
        trace.draw(tmp_path / "gpt2.svg", depth=2)
        assert drawn[-1] == trace.to_dot(depth=2)
