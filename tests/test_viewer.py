"""The viewer page without a browser: its data (groups, runs, stats, verdicts), that it is
self-contained and sized by ops not values, ``show``/``Trace.show``/``torchlens show --html``."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from importlib.resources import files

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.cli import main
from torchlens.errors import InvalidArgumentError
from torchlens.replay.status import ReplayFailure, ReplayStatus
from torchlens.viz import ViewerPage, show, viewer_html
from torchlens.viz import _viewer_data as data_module
from torchlens.viz._viewer_data import viewer_data


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x)) + x


class Stack(nn.Module):
    def __init__(self, n: int = 4) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*[Block() for _ in range(n)])
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x))


def _stack_trace(batch: int = 2) -> tl.Trace:
    torch.manual_seed(0)
    return tl.trace(Stack(), torch.randn(batch, 8))


def _page_data(html: str) -> dict:
    match = re.search(r'<script id="tl-data" type="application/json">(.*?)</script>', html, re.S)
    assert match is not None
    return json.loads(match.group(1))


def test_groups_nest_module_calls_and_fold_runs_with_a_count():
    data = viewer_data(_stack_trace())
    by_id = {g["id"]: g for g in data["groups"]}
    run = by_id["run blocks.0:1"]
    assert run["r"] == 4 and run["m"] == "Block" and run["n"] == 12
    assert by_id["blocks.2:1"]["p"] == data["groups"].index(run)
    assert data["groups"][run["p"]]["id"] == "blocks:1"
    relu = next(n for n in data["nodes"] if n["id"] == "relu_3")
    assert data["groups"][relu["g"]]["id"] == "blocks.2:1"
    head = next(n for n in data["nodes"] if n["id"] == "linear_5")
    assert head["g"] == -1 and head["ms"] == ["head:1"]  # a one-op call is named in its op


def test_edges_follow_the_trace():
    trace = _stack_trace()
    data = viewer_data(trace)
    ids = [n["id"] for n in data["nodes"]]
    edges = {(ids[a], ids[b]) for a, b in data["edges"]}
    assert ("input_1", "linear_1") in edges and ("relu_1", "add_1") in edges
    assert ("linear_5", "output 1") in edges
    assert len(data["edges"]) == sum(
        1 for op in trace for p in op.parents if p in trace.input_labels or p in trace.labels
    ) + len(trace.output_labels)


def test_op_fields_and_statistics_match_the_saved_value():
    trace = _stack_trace()
    node = next(n for n in viewer_data(trace)["nodes"] if n["id"] == "relu_2")
    value = trace["relu_2"].out.double()
    st = node["st"]
    assert node["f"] == "relu" and node["s"] == "(2, 8)" and node["dt"] == "float32"
    assert node["ms"] == ["blocks:1", "blocks.1:1", "blocks.1.act:1"]
    assert node["par"] == ["linear_2"] and node["ch"] == ["add_2"]
    assert node["a"] == "relu(linear_2, inplace=False)"
    assert st["min"] == pytest.approx(value.min().item(), rel=1e-4, abs=1e-6)
    assert st["max"] == pytest.approx(value.max().item(), rel=1e-4)
    assert st["std"] == pytest.approx(value.std().item(), rel=1e-4)
    assert st["zeros"] == pytest.approx((value == 0).double().mean().item(), abs=1e-4)
    assert sum(st["hist"]) == value.numel() and len(st["hist"]) == 16
    linear = next(n for n in viewer_data(trace)["nodes"] if n["id"] == "linear_1")
    assert linear["w"] == ["blocks.0.fc.weight", "blocks.0.fc.bias"]
    assert linear["a"] == "linear(input_1, blocks.0.fc.weight, blocks.0.fc.bias)"


def test_nan_and_inf_are_counted():
    trace = tl.trace(nn.Sequential(nn.ReLU()), torch.tensor([[1.0, float("nan"), float("inf")]]))
    st = viewer_data(trace)["nodes"][1]["st"]
    assert (st["nan"], st["inf"], st["min"], st["max"]) == (1, 1, 1.0, 1.0)


def test_structure_only_trace_has_no_statistics():
    trace = tl.trace(Stack(), torch.randn(2, 8), structure_only=True)
    assert all("st" not in n for n in viewer_data(trace)["nodes"])
    assert "not saved" in viewer_html(trace)


def test_values_are_not_embedded_unless_asked():
    small, big = viewer_html(_stack_trace(2)), viewer_html(_stack_trace(4000))
    assert abs(len(big) - len(small)) < 0.05 * len(small)  # 2,000x the values, same size
    data = _page_data(viewer_html(_stack_trace(2), values=3))
    node = next(n for n in data["nodes"] if n["id"] == "relu_1")
    assert len(node["st"]["vals"]) == 3
    assert "vals" not in json.dumps(_page_data(small))


def test_verdicts_come_from_the_status():
    trace = _stack_trace()
    status = ReplayStatus(
        "failed",
        ops=len(trace),
        failures=[ReplayFailure("relu_2", "replay", "max abs diff 1.0")],
        unchecked=[ReplayFailure("add_3", "perturbation", "no probe moved it")],
    )
    data = _page_data(viewer_html(trace, status=status))
    verdicts = {n["id"]: n.get("v") for n in data["nodes"] if n["k"] not in ("input", "output")}
    assert verdicts.pop("relu_2") == "failed" and verdicts.pop("add_3") == "unverified"
    assert set(verdicts.values()) == {"passed"}
    relu = next(n for n in data["nodes"] if n["id"] == "relu_2")
    assert relu["why"] == ["[replay] max abs diff 1.0"] and data["status"] == "failed"


def test_an_unavailable_status_verifies_nothing():
    trace = _stack_trace()
    data = viewer_data(trace, status=ReplayStatus("unavailable"))
    assert {n.get("v") for n in data["nodes"] if n["k"] == "op"} == {"unverified"}


def test_real_replay_status_overlays():
    model, x = Stack().eval(), torch.randn(2, 8)
    data = viewer_data(tl.trace(model, x), status=tl.replay(model, x))
    assert data["status"] == "passed"
    assert {n["v"] for n in data["nodes"] if n["k"] in ("op", "layout")} == {"passed"}


def test_page_is_self_contained():
    html = viewer_html(_stack_trace())
    assert html.startswith("<!DOCTYPE html>")
    assert "default-src 'none'" in html  # the browser itself refuses any fetch
    assert not re.search(r"\b(src|href)=\"(?!data:)", html)
    assert "http://" not in html and "https://" not in html
    assert html.count("<script") == 2 and html.count("</script>") == 2


def test_labels_cannot_close_the_script():
    model = nn.Sequential()
    model.add_module("</script><b>x", nn.Sequential(nn.Linear(2, 2), nn.ReLU()))
    html = viewer_html(tl.trace(model, torch.randn(1, 2)))
    assert html.count("</script>") == 2
    assert _page_data(html)["groups"][0]["t"] == "</script><b>x"


def test_graphviz_orders_branches_where_installed(monkeypatch):
    trace = _stack_trace()
    if data_module.shutil.which("dot"):
        assert viewer_data(trace)["layout"] == "graphviz"
        assert any(n.get("x") for n in viewer_data(trace)["nodes"])
    monkeypatch.setattr(data_module.shutil, "which", lambda name: None)
    data = viewer_data(trace)
    assert data["layout"] == "page" and all("x" not in n for n in data["nodes"])


def test_show_writes_the_page_and_opens_only_when_asked(tmp_path, monkeypatch):
    opened: list[str] = []
    monkeypatch.setattr("webbrowser.open", opened.append)
    trace = _stack_trace()
    page = show(trace, tmp_path / "g.html")
    assert isinstance(page, ViewerPage) and page.path == tmp_path / "g.html"
    assert os.fspath(page) == str(tmp_path / "g.html") and opened == []
    assert _page_data(page.path.read_text())["ops"] == len(trace)
    page = trace.show(tmp_path / "h.html", open=True)
    assert opened == [page.path.resolve().as_uri()]
    temporary = trace.show()
    assert temporary.path.suffix == ".html" and temporary.path.exists()


def test_notebook_renders_the_page_inline(tmp_path):
    page = _stack_trace().show(tmp_path / "g.html")
    inline = page._repr_html_()
    assert inline.startswith("<iframe srcdoc=") and "&lt;!DOCTYPE html&gt;" in inline
    assert "<script" not in inline  # the page is escaped into the attribute


@pytest.mark.parametrize(
    "kwargs", [{"path": "g.svg"}, {"values": -1}, {"values": True}, {"status": "passed"}]
)
def test_bad_options_are_typed_errors(tmp_path, kwargs):
    kwargs = {**kwargs, "path": tmp_path / kwargs.get("path", "g.html")}
    with pytest.raises(InvalidArgumentError) as err:
        show(_stack_trace(), **kwargs)
    assert err.value.code == "bad_option"


def test_cli_show_html(tmp_path, capsys):
    saved = _stack_trace().save(tmp_path / "saved")
    out = tmp_path / "page.html"
    assert main(["show", str(saved), "--html", str(out)]) == 0
    assert "viewer page:" in capsys.readouterr().out
    assert _page_data(out.read_text())["nodes"][1]["st"]["hist"]  # values loaded from disk
    assert main(["show", str(saved), "--html", str(tmp_path / "page.svg")]) == 2
    assert ".html" in capsys.readouterr().err


def test_assets_ship_with_the_package():
    assets = files("torchlens.viz") / "viewer_assets"
    names = {"viewer.html", "viewer.css", "viewer.js", "panel.js", "route.js"}
    assert all((assets / name).is_file() for name in names)


def _fit(how: str, *sizes: tuple[float, float, float, float]) -> list[dict]:
    """Run the page's own ``tlFit.<how>`` (viewer_assets/fit.js) in Node on each size."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("no Node.js to run the viewer's fit.js")
    script = (files("torchlens.viz") / "viewer_assets" / "fit.js").read_text(encoding="utf-8")
    calls = ",".join(f"tlFit.{how}({w}, {h}, {W}, {H})" for w, h, W, H in sizes)
    run = subprocess.run(
        [node, "-e", f"{script}\nconsole.log(JSON.stringify([{calls}]))"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    return json.loads(run.stdout)


def test_fit_shows_the_whole_graph_both_ways():
    window = (1200, 760)
    tall, wide, small = (300, 9390), (5000, 400), (200, 100)  # a 2-layer GPT-2 strip, ...
    views = _fit("whole", *[(*graph, *window) for graph in (tall, wide, small)])
    for (w, h), view in zip((tall, wide, small), views):
        left, top = view["x"], view["y"]
        right, bottom = left + w * view["k"], top + h * view["k"]
        assert 20 - 1e-9 <= left and right <= window[0] - 20 + 1e-9, (w, h, view)
        assert 20 - 1e-9 <= top and bottom <= window[1] - 20 + 1e-9, (w, h, view)
        assert left + right == pytest.approx(window[0])  # centred across
    assert views[0]["k"] == pytest.approx(720 / 9390)  # the height decides for the strip
    assert views[1]["k"] == pytest.approx(1160 / 5000)  # the width for the wide one
    assert views[2]["k"] == 1  # never enlarged past 1:1
    (first,) = _fit("top", (*tall, *window))  # the first view: full width, from the top
    assert (first["k"], first["y"]) == (1, 20)
