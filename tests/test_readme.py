"""The README's example and set-up commands stay true."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

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


_STUB = """#!/usr/bin/env bash
echo "$(basename "$0") $*" >> "$LOG"
if [ "$1 $2" = "-m venv" ]; then
  mkdir -p "$3/bin" && touch "$3/made"
  printf 'export PATH="%s/bin:$PATH"\\n' "$PWD/$3" > "$3/bin/activate"
  cp "$0" "$3/bin/python" && cp "$(dirname "$0")/pip" "$3/bin/pip"
fi
"""


def _run_setup(commands: list[str], folder: Path) -> list[str]:
    """Run set-up commands in ``folder`` with stand-ins for python and pip that log calls."""
    stubs = folder / "stubs"
    stubs.mkdir(exist_ok=True)
    for name in ("python", "pip"):
        (stubs / name).write_text(_STUB)
        (stubs / name).chmod(0o755)
    log = folder / "log"
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "LOG": str(log)}
    for command in commands:
        subprocess.run(["bash", "-ec", command], cwd=folder, env=env, check=True)
    return [line.split()[:3] for line in log.read_text().splitlines()]


def test_the_second_setup_command_follows_the_first_and_works_alone(tmp_path):
    first, second = (line for block in _blocks("bash")[:2] for line in block.splitlines())
    assert "demo" in first and "pytest" in second
    alone = tmp_path / "alone"
    alone.mkdir()
    assert _run_setup([second], alone) == [
        ["python", "-m", "venv"], ["pip", "install", "-q"], ["python", "-m", "pytest"]
    ]  # fmt: skip
    both = tmp_path / "both"
    both.mkdir()
    calls = _run_setup([first, second], both)
    assert calls.count(["python", "-m", "venv"]) == 1  # the second reuses the first's venv
    assert calls[-2:] == [["pip", "install", "-q"], ["python", "-m", "pytest"]]


def test_the_zoo_size_and_the_transformers_range_are_stated_once_and_true():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    sys.path.insert(0, str(README.parent / "tests"))
    try:
        from realworld.cases import CASES
    finally:
        sys.path.remove(str(README.parent / "tests"))
    validation = (README.parent / "docs" / "validation.md").read_text()
    stated = {int(n) for text in (README.read_text(), validation)
              for n in re.findall(r"more than (\d+)\s+cases", text)}  # fmt: skip
    assert len(stated) == 1 and len(CASES) > stated.pop()
    assert not re.search(r"about 1[0-9]0\s+(architectures|cases)", README.read_text() + validation)
    extras = tomllib.loads((README.parent / "pyproject.toml").read_text())["project"]
    ranges = {
        dep.removeprefix("transformers")
        for extra in ("test", "zoo")
        for dep in extras["optional-dependencies"][extra]
        if dep.startswith("transformers")
    }
    assert len(ranges) == 1 and f"`transformers`: `{ranges.pop()}`" in README.read_text()


def test_limits_come_before_set_up_and_benchmarks():
    headings = re.findall(r"^## (.+)$", README.read_text(), flags=re.M)
    assert headings.index("What it cannot do") < headings.index("Set-up")
    assert headings.index("What it cannot do") < headings.index("Benchmarks")
