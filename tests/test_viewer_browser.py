"""The viewer page in a real headless Chromium (the system's, driven by Playwright).

Every request other than the page's own file is blocked and recorded: the page must load with
no console error and fetch nothing. Skipped cleanly when Playwright or Chromium is missing
(``pip install -e ".[browser]"`` and ``apt-get install chromium``).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.replay.status import ReplayFailure, ReplayStatus

sync_api = pytest.importorskip("playwright.sync_api", reason="pip install -e '.[browser]'")
expect = sync_api.expect
CHROMIUM = next(
    (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None
)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium (apt-get install chromium)")
# headless, and no calls home (without these flags Chromium tries to reach Google)
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update",
        "--disable-sync"]  # fmt: skip


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = torch.softmax(self.q(x) @ self.k(x).transpose(-1, -2), dim=-1)
        return weights @ self.v(x)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = Attention()
        self.mlp = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(x + self.attn(x))


class Model(nn.Module):
    """Big enough (~300 ops) that the page starts folded."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*[Block() for _ in range(20)])
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x).relu())


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    with sync_api.sync_playwright() as pw:
        try:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, timeout=30_000)
        except sync_api.Error as err:  # installed but unable to start here (no display libs)
            pytest.skip(f"{CHROMIUM} could not start: {str(err).splitlines()[0]}")
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def trace() -> tl.Trace:
    torch.manual_seed(0)
    return tl.trace(Model().eval(), torch.randn(2, 5, 8))


class Page:
    """An open viewer page, with what it logged and what it tried to fetch."""

    def __init__(self, browser: object, path: Path) -> None:
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.page = browser.new_page(viewport={"width": 1200, "height": 800})
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.route("**/*", self._route)
        self.page.goto(path.as_uri())
        self.page.wait_for_selector("body[data-ready='1']", timeout=20_000)

    def _route(self, route: object) -> None:
        if route.request.url.startswith("file://"):
            route.continue_()
        else:
            self.requests.append(route.request.url)
            route.abort()

    def node(self, label: str) -> object:
        index = self.page.evaluate(f"window.tlViewer.nodes.findIndex(n => n.id === {label!r})")
        return self.page.locator(f"g.box[data-n='{index}']")

    def on_screen(self, locator: object) -> bool:
        box = locator.bounding_box()
        return (
            box is not None
            and 0 <= box["x"]
            and box["x"] + box["width"] <= 1200
            and (41 <= box["y"] and box["y"] + box["height"] <= 800)
        )


@pytest.fixture
def open_page(browser: object, tmp_path: Path) -> Iterator[object]:
    pages: list[Page] = []

    def opener(trace: tl.Trace, **options: object) -> Page:
        path = trace.show(tmp_path / f"page{len(pages)}.html", **options).path
        pages.append(Page(browser, path))
        return pages[-1]

    yield opener
    for page in pages:
        assert page.errors == [], page.errors
        assert page.requests == [], page.requests
        page.page.close()


def test_loads_folded_and_a_module_unfolds_on_click(open_page, trace):
    viewer = open_page(trace)
    page = viewer.page
    assert "×20" in page.locator("g.frame.run").text_content()  # 20 blocks as a counted run
    assert page.locator("g.box[data-n]").count() < 80  # folded to a readable start
    folded = page.locator("g.box.group", has_text="blocks.0.attn")
    assert "Attention · 7 ops" in folded.text_content() and viewer.node("softmax_1").count() == 0
    folded.click()
    frame = page.locator("g.frame", has_text="blocks.0.attn (Attention)")
    expect(frame).to_have_count(1)
    expect(folded).to_have_count(0)
    expect(viewer.node("softmax_1")).to_have_count(1)
    assert viewer.on_screen(viewer.node("linear_1"))
    frame.locator("text.t").click()  # clicking the title folds it again
    expect(frame).to_have_count(0)
    expect(folded).to_have_count(1)
    expect(viewer.node("softmax_1")).to_have_count(0)


def test_search_centres_and_highlights_a_folded_op(open_page, trace):
    viewer = open_page(trace)
    page = viewer.page
    assert viewer.node("softmax_12").count() == 0  # inside folded block 12
    page.fill("#search", "softmax_12")
    expect(page.locator("#hits")).to_have_text("1 / 1")
    found = viewer.node("softmax_12")
    assert "hit" in found.get_attribute("class") and viewer.on_screen(found)
    page.fill("#search", "blocks.3.mlp")  # a module address finds its ops
    expect(page.locator("#hits")).to_have_text("1 / 3")


def test_side_panel_shows_the_op(open_page, trace):
    viewer = open_page(trace)
    page = viewer.page
    page.fill("#search", "linear_6")  # also finds linear_60..69, the exact label first
    expect(page.locator("#hits")).to_have_text("1 / 11")
    viewer.node("linear_6").click()
    panel = page.locator("#panel")
    assert panel.is_visible() and panel.locator("h2").inner_text() == "linear_6"
    assert panel.locator("code.shape").inner_text() == "(2, 5, 8)"
    assert "blocks:1 › blocks.1:1 › blocks.1.attn:1 › blocks.1.attn.q:1" in panel.inner_text()
    assert panel.locator("svg.hist rect").count() == 16
    panel.locator("a", has_text="matmul_3").click()  # a child: the panel follows
    assert panel.locator("h2").inner_text() == "matmul_3"
    page.keyboard.press("Escape")
    assert not panel.is_visible()


def test_pan_and_zoom_with_keys_and_wheel(open_page, trace):
    page = open_page(trace).page
    view = "window.tlViewer.view()"
    before = page.evaluate(view)
    page.locator("#graph").focus()
    page.keyboard.press("ArrowDown")
    assert page.evaluate(view)["y"] == before["y"] - 80
    page.keyboard.press("+")
    assert page.evaluate(view)["k"] == pytest.approx(before["k"] * 1.25)
    page.mouse.move(600, 400)
    page.mouse.wheel(0, 300)
    assert page.evaluate(view)["k"] < before["k"] * 1.25
    page.mouse.move(300, 600)  # drag the background
    page.mouse.down()
    page.mouse.move(400, 650, steps=4)
    page.mouse.up()
    page.wait_for_timeout(50)
    assert page.evaluate(view)["x"] != before["x"]


def test_validation_overlay_colours_ops_and_folded_groups(open_page, trace):
    status = ReplayStatus(
        "failed", ops=len(trace), failures=[ReplayFailure("gelu_7", "replay", "diff 1.0")]
    )
    viewer = open_page(trace, status=status)
    page = viewer.page
    page.click("#fold")  # everything folded: the one box left is red
    failed = page.locator("g.box.group.v-failed")
    expect(failed).to_have_count(1)
    assert "Sequential · 240 ops" in failed.text_content()
    assert "failed 1" in page.locator("#legend").inner_text()
    page.fill("#search", "gelu_7")
    expect(page.locator("#hits")).to_have_text("1 / 1")
    assert "v-failed" in viewer.node("gelu_7").get_attribute("class")
    assert (
        page.locator("g.box.v-passed").count() > 10 and page.locator("g.box.v-failed").count() == 1
    )
    viewer.node("gelu_7").click()
    assert "[replay] diff 1.0" in page.locator("#panel").inner_text()


class Branches(nn.Module):
    """Parallel branches of different widths, a constant and a residual: boxes side by side."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = [x * torch.tensor(2.0), x.relu(), torch.sigmoid(x).transpose(0, 1).transpose(0, 1)]
        return torch.stack(parts).sum(0) + x


@pytest.mark.parametrize("unfold", ["all", "none"])
def test_boxes_never_overlap(open_page, trace, unfold):
    for model_trace in (trace, tl.trace(Branches(), torch.randn(2, 3))):
        page = open_page(model_trace).page
        if unfold == "all":
            page.evaluate("() => { tlViewer.expanded.fill(1); tlViewer.toggle(1, true); }")
        boxes = page.evaluate("() => tlViewer.boxes()")
        unfolded = "() => [...tlViewer.expanded.keys()].filter(i => i && tlViewer.expanded[i])"
        frames = {f"g{i}" for i in page.evaluate(unfolded)}
        leaves = [b for key, b in boxes.items() if key not in frames and key != "g0"]
        assert len(leaves) >= 8
        for i, a in enumerate(leaves):
            for b in leaves[i + 1 :]:
                apart_x = a["x"] + a["w"] <= b["x"] + 0.5 or b["x"] + b["w"] <= a["x"] + 0.5
                apart_y = a["y"] + a["h"] <= b["y"] + 0.5 or b["y"] + b["h"] <= a["y"] + 0.5
                assert apart_x or apart_y, (a, b)


def test_a_long_graph_draws_only_what_is_on_screen(open_page):
    layers: list[nn.Module] = []
    for _ in range(2500):
        layers += [nn.Linear(2, 2), nn.ReLU()]
    with torch.no_grad():
        long = tl.trace(nn.Sequential(*layers), torch.randn(1, 2))
    viewer = open_page(long)
    page = viewer.page
    assert page.evaluate("() => tlViewer.firstPaint") < 10_000
    assert 5 < page.locator("g.box").count() < 100  # 5,000 ops, a screenful drawn
    page.fill("#search", "relu_2500")
    expect(page.locator("#hits")).to_have_text("1 / 1")
    assert viewer.on_screen(viewer.node("relu_2500"))  # drawn on arrival
    assert page.locator("g.box").count() < 100


def test_screenshot(open_page, trace):
    page = open_page(trace, status=tl.replay(Model().eval(), torch.randn(2, 5, 8))).page
    shot = page.screenshot()
    assert shot[:8] == b"\x89PNG\r\n\x1a\n" and len(shot) > 10_000


def test_fit_shows_the_whole_graph_both_ways(open_page, trace):
    """The first view is full width from the top; "Fit" then frames the whole graph."""
    page = open_page(trace).page
    page.evaluate("() => { tlViewer.expanded.fill(1); tlViewer.toggle(1, true); }")
    size = page.evaluate(
        "() => ({ w: document.getElementById('graph').clientWidth,"
        " h: document.getElementById('graph').clientHeight })"
    )
    root = page.evaluate("() => tlViewer.boxes().g0")
    assert root["h"] > 3 * size["h"]  # unfolded, the graph is far taller than the window
    page.click("#fit")
    view = page.evaluate("window.tlViewer.view()")
    assert view["x"] >= 19 and view["x"] + root["w"] * view["k"] <= size["w"] - 19
    assert view["y"] >= 19 and view["y"] + root["h"] * view["k"] <= size["h"] - 19


class LoopRNN(nn.Module):
    """20 steps of one RNN cell: rolled, the page shows the loop body once."""

    def __init__(self) -> None:
        super().__init__()
        self.cell, self.out = nn.RNNCell(4, 8), nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.zeros(x.shape[0], 8)
        for t in range(x.shape[1]):
            h = self.cell(x[:, t], h) * 0.5
        return self.out(h)


def test_rolled_switch_draws_each_layer_once(open_page):
    trace = tl.trace(LoopRNN(), torch.randn(2, 20, 4))
    viewer = open_page(trace, rolled=True)
    page = viewer.page
    button = page.locator("#roll")
    assert button.is_visible() and button.inner_text() == "Unrolled"
    assert (
        page.locator("g.box[data-n]").count() == 7
    )  # input, zeros, getitem, cell, mul, linear, output
    cell = viewer.node("rnn_tanh_cell_1")
    assert "×20 passes" in cell.text_content() and "passes" in cell.get_attribute("class")
    assert page.locator("#edges text.pass").all_text_contents() == ["1→2 … 19→20"]
    assert viewer.node("rnn_tanh_cell_7").count() == 0
    button.click()
    expect(viewer.node("rnn_tanh_cell_7")).to_have_count(1)
    assert page.locator("g.box[data-n]").count() == 64 and button.inner_text() == "Rolled"
    assert page.locator("#edges text.pass").count() == 0
    page.fill("#search", "mul_9")  # a later pass, found unrolled; rolled it is its layer's box
    expect(page.locator("#hits")).to_have_text("1 / 1")
    button.click()
    expect(viewer.node("mul_9")).to_have_count(0)
    viewer.node("mul_1").click()
    assert "layer:pass" in page.locator("#panel").inner_text()


def test_no_rolled_switch_without_repeated_layers(open_page, trace):
    assert not open_page(trace).page.locator("#roll").is_visible()


class ScaledByItem(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(x) * self.a(x).abs().mean().item()


def test_hidden_edges_are_dashed_and_the_legend_counts_the_status_verdicts(open_page):
    torch.manual_seed(0)
    checked = tl.trace(ScaledByItem().eval(), torch.randn(2, 8), validate=True)
    assert checked.status.state == "incomplete"
    viewer = open_page(checked)  # trace.status by default
    page = viewer.page
    expect(page.locator("path.hidden-edge")).to_have_count(1)
    expect(page.locator("text.esc-mark")).to_have_count(1)  # mean_1's value went to Python
    assert "v-incomplete" in viewer.node("mul_1").get_attribute("class")
    legend = page.locator("#legend").inner_text()
    passed = sum(v.state == "passed" for v in checked.status.verdicts.values())
    assert "validation: incomplete" in legend and f"passed {passed}" in legend
    assert "incomplete 1" in legend and "hidden edges 1" in legend
