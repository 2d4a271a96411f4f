"""docs/extraction.md's Python examples run as written and print what the page says."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "extraction.md"


def test_extraction_examples_run(tmp_path, monkeypatch, capsys):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) == 5
    monkeypatch.chdir(tmp_path)  # the examples write to ./cnn_features, ./features, ...
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), {})
    out = capsys.readouterr().out
    for line in re.findall(r"print\(.*?\)[ \t]+# (.+)", "\n".join(blocks)):
        assert line.strip() in out, line
    accuracy = float(re.search(r"probe accuracy (\S+)", out).group(1))
    assert accuracy > 0.85
    assert (tmp_path / "features" / "manifest.json").exists()
