"""The viewer page: file size and time to first paint in headless Chromium.

GPT-style decoders of ~300, ~2,000 and ~10,000 ops (the 2,000-op one is
``bench_draw.py``'s). For each: ops, seconds to write the page, its size, and the time from
navigation start to the first painted frame in headless Chromium (``/usr/bin/chromium``,
driven by Playwright; skipped when either is missing). Run:
``python benchmarks/bench_viewer.py``.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from models import GPTDecoder  # noqa: E402

import torchlens as tl  # noqa: E402
from torchlens.viz.viewer import show  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
# headless, and no calls home (without these flags Chromium tries to reach Google)
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update",
        "--disable-sync"]  # fmt: skip
LAYERS = {"gpt_300": 11, "gpt_2000": 74, "gpt_10000": 370}


def first_paint_ms(path: Path) -> float:
    """Milliseconds from navigation start to the page's first painted frame."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto(path.as_uri())
        page.wait_for_selector("body[data-ready='1']", timeout=120_000)
        paint = float(page.evaluate("window.tlViewer.firstPaint"))
        browser.close()
    return paint


def main() -> int:
    browser = shutil.which(CHROMIUM) is not None
    try:
        import playwright  # noqa: F401
    except ImportError:
        browser = False
    print(f"{'model':<11}{'ops':>7}{'write s':>9}{'size KB':>9}{'first paint ms':>16}")
    folder = Path(tempfile.mkdtemp())
    for name, layers in LAYERS.items():
        torch.manual_seed(0)
        model = GPTDecoder(vocab_size=100, d_model=32, n_layers=layers, n_heads=4, context=16)
        with torch.no_grad():
            trace = tl.trace(model.eval(), torch.randint(0, 100, (2, 16)))
        start = time.perf_counter()
        page = show(trace, folder / f"{name}.html")
        write = time.perf_counter() - start
        size = page.path.stat().st_size / 1024
        paint = f"{first_paint_ms(page.path):.0f}" if browser else "no browser"
        print(f"{name:<11}{len(trace):>7}{write:>9.2f}{size:>9.0f}{paint:>16}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
