"""The README's example and set-up commands stay true."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_example_runs(capsys):
    exec(compile(_blocks("python")[0], str(README), "exec"), {})
    assert "['linear', 'relu', 'linear']" in capsys.readouterr().out


def test_ci_runs_the_readme_test_command():
    commands = [line for block in _blocks("bash") for line in block.splitlines()]
    test_command = next(line for line in commands if "pytest" in line)
    ci = (README.parent / ".ci" / "run").read_text()
    assert test_command in ci.splitlines()
    assert any("python -m torchlens demo" in line for line in commands)
