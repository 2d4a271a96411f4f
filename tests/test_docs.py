"""Every Python code block in the README and in ``docs/`` runs when pasted alone.

Each ```` ```python ```` block is run by itself, in a fresh namespace and an empty working
directory, so a block that leans on an earlier one (a ``model`` defined three blocks up, a
missing import) fails here the way it fails for a reader who pastes it. Blocks in other
languages (```` ```bash ````, ```` ```text ````, plain ```` ``` ````) are not run.

A Python block that must not run (it sketches code the reader fills in, or needs hardware a
test machine lacks) is marked by this comment on the line right above its fence, which
Markdown renders as nothing::

    <!-- docs-test: skip (the reason) -->

Blocks that draw need Graphviz's ``dot``; without it they are skipped, as the drawing tests
are.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from torchlens.backends.registry import backend_specs, unregister_backend_spec
from torchlens.errors import GraphvizMissingError

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SKIP_MARKER = re.compile(r"<!--\s*docs-test:\s*skip\b.*-->")
_FENCE = re.compile(r"^```(\S*)[^\n]*\n(.*?)^```\s*$", re.S | re.M)


def _blocks() -> list[tuple[str, int, str, bool]]:
    """``(page, line, code, skipped)`` for every Python block of every page."""
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in _FENCE.finditer(text):
            if match.group(1) != "python":
                continue
            line = text.count("\n", 0, match.start()) + 1
            above = text[: match.start()].rstrip("\n").rpartition("\n")[2]
            name = str(page.relative_to(ROOT))
            found.append((name, line, match.group(2), bool(SKIP_MARKER.search(above))))
    return found


BLOCKS = _blocks()


def test_every_page_has_runnable_blocks():
    pages = {page for page, _, _, skipped in BLOCKS if not skipped}
    assert {"README.md", "docs/capture.md", "docs/selectors.md"} <= pages
    assert len(pages) >= len(PAGES) - 1, set(map(str, PAGES)) - pages


@pytest.fixture
def clean_registry():
    before = {spec.name for spec in backend_specs()}
    yield
    for spec in backend_specs():
        if spec.name not in before:
            unregister_backend_spec(spec.name)


@pytest.mark.parametrize(
    ("page", "line", "code", "skipped"), BLOCKS, ids=[f"{p}:{n}" for p, n, _, _ in BLOCKS]
)
def test_block_runs_alone(page, line, code, skipped, tmp_path, monkeypatch, clean_registry):
    if skipped:
        pytest.skip(f"{page}:{line} is marked docs-test: skip")
    monkeypatch.chdir(tmp_path)
    source = "\n" * (line) + code  # tracebacks point at the page's own line numbers
    try:
        exec(compile(source, str(ROOT / page), "exec"), {"__name__": "__docs__"})
    except GraphvizMissingError:
        if shutil.which("dot") is not None:
            raise
        pytest.skip("drawing needs Graphviz's dot")


# Words that only make sense to the people who built torchlens.
JARGON = re.compile(r"issue \d|the spec's|spec's table|preview-backend|\bfastlog\b(?!`)", re.I)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_pages_use_no_words_a_user_cannot_know(page):
    text = page.read_text(encoding="utf-8")
    assert JARGON.findall(text) == []


def test_every_capability_row_is_explained_in_the_backends_page():
    from torchlens.capabilities import TORCH_CAPABILITIES

    text = (ROOT / "docs" / "backends.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `(\w+)` \| (.+) \|$", text, re.M))
    assert set(TORCH_CAPABILITIES) <= set(rows)
    assert "tl.record" in rows["fastlog"]


def test_readme_says_how_to_install_and_what_the_skips_mean():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    setup = text.partition("## Set-up")[2].partition("\n## ")[0]
    assert "clone of this repository" in setup and "`pip install torchlens` installs" in setup
    skip_reason = "the spec is not checked out next to the repo"
    assert skip_reason in setup
    for test in ("test_backends.py", "test_tutorial.py"):
        assert skip_reason in (ROOT / "tests" / test).read_text(encoding="utf-8")
