"""The command line for saved traces (``show``, ``info``) and for ``trace``'s outputs."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.cli import main

USER_FILE = textwrap.dedent(
    """
    import torch
    from torch import nn

    def build():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
        return model, (torch.randn(3, 4),)

    def wrong_width():
        return nn.Sequential(nn.Linear(4, 8), nn.Linear(4, 2)), (torch.randn(3, 4),)
    """
)


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), *[nn.Tanh() for _ in range(60)])
    return tl.trace(model.eval(), torch.randn(3, 4)).save(tmp_path / "run")


@pytest.fixture
def user_file(tmp_path: Path) -> Path:
    path = tmp_path / "user_model.py"
    path.write_text(USER_FILE)
    return path


def test_show_prints_the_summary_with_filters(saved, capsys):
    assert main(["show", str(saved)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Trace: 62 ops") and "linear_1" in out and "tanh_60" in out
    assert "22 more ops" in out and "tanh_30 " not in out
    assert main(["show", str(saved), "--all"]) == 0
    assert "tanh_30 " in capsys.readouterr().out
    assert main(["show", str(saved), "--func", "relu", "--func", "linear"]) == 0
    out = capsys.readouterr().out
    assert "relu_1" in out and "linear_1" in out and "tanh_1 " not in out
    assert main(["show", str(saved), "--module", "1*", "--max-rows", "4"]) == 0
    out = capsys.readouterr().out
    assert "relu_1" in out and "linear_1" not in out and "more ops" in out


def test_info_prints_the_metadata(saved, capsys):
    assert main(["info", str(saved)]) == 0
    lines = capsys.readouterr().out.splitlines()[2:]
    rows = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in lines)
    assert rows["model"] == "Sequential" and rows["mode"] == "eval"
    assert rows["ops"] == "62" and rows["values saved"] == "62 of 62 ops"
    assert rows["torch"] == torch.__version__ and rows["format"].startswith("torchlens-trace")


@pytest.mark.parametrize("command", ["show", "info"])
def test_a_directory_without_a_trace_is_a_usage_error(command, tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("hello")
    assert main([command, str(tmp_path)]) == 2
    assert "no torchlens trace" in capsys.readouterr().err
    assert main([command, str(tmp_path / "missing")]) == 2
    assert "no such directory" in capsys.readouterr().err


def test_draw_names_the_suffixes_it_takes(user_file, tmp_path, capsys):
    assert main(["trace", f"{user_file}:build", "--draw", str(tmp_path / "g.jpg")]) == 2
    err = capsys.readouterr().err
    assert ".svg, .png, .pdf" in err and "format=" not in err
    assert not (tmp_path / "g.jpg").exists()


def test_save_refuses_an_existing_trace_unless_forced(user_file, tmp_path, capsys):
    target = tmp_path / "out"
    assert main(["trace", f"{user_file}:build", "--save", str(target), "--no-validate"]) == 0
    first = (target / "manifest.json").read_bytes()
    (target / "manifest.json").write_bytes(first.replace(b'"format_version"', b'"format_version" '))
    capsys.readouterr()
    assert main(["trace", f"{user_file}:build", "--save", str(target), "--no-validate"]) == 2
    assert "--force" in capsys.readouterr().err
    assert (target / "manifest.json").read_bytes() != first  # untouched
    args = ["trace", f"{user_file}:build", "--save", str(target), "--no-validate", "--force"]
    assert main(args) == 0
    assert (target / "manifest.json").read_bytes() == first  # replaced
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    assert main([*args[:3], str(other), "--force"]) == 2
    assert (other / "notes.txt").read_text() == "mine"


def test_a_models_error_names_the_op_it_hit(user_file, capsys):
    assert main(["trace", f"{user_file}:wrong_width"]) == 1
    err = capsys.readouterr().err
    assert "RuntimeError" in err and "while running linear_2 in 1" in err


def test_cut_tables_name_the_command_lines_flags(saved, tmp_path, capsys):
    assert main(["show", str(saved)]) == 0
    out = capsys.readouterr().out
    assert "(22 ops not shown: --all prints every row" in out
    assert "max_rows=None" not in out and "trace.summary" not in out
    other = tl.trace(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), *[nn.Tanh()] * 60).eval(),
                     torch.randn(3, 4)).save(tmp_path / "other")  # fmt: skip
    main(["diff", str(saved), str(other)])
    out = capsys.readouterr().out
    assert "(22 rows not shown: --all prints every row, --diverged only" in out
    main(["diff", str(saved), str(other), "--all"])
    assert "not shown" not in capsys.readouterr().out


@pytest.fixture(scope="module")
def long_saved(tmp_path_factory) -> Path:
    """A trace whose summary is far longer than a pipe's buffer (64 KiB)."""
    model = nn.Sequential(nn.Linear(4, 8), *[nn.Tanh() for _ in range(3000)])
    return tl.trace(model.eval(), torch.randn(3, 4)).save(tmp_path_factory.mktemp("t") / "run")


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("head") is None, reason="a shell")
@pytest.mark.parametrize("command", ["show", "diff"])
def test_a_closed_pipe_ends_quietly_with_exit_141(command, long_saved):
    """``torchlens show DIR --all | head``: no traceback, the exit code of a SIGPIPE."""
    dirs = [str(long_saved)] * (2 if command == "diff" else 1)
    cli = " ".join([shlex.quote(sys.executable), "-m", "torchlens", command, *dirs, "--all"])
    run = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {cli} | head -n 3"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(tl.__file__).parents[1])},
        timeout=120,
    )
    assert run.stderr == ""
    assert len(run.stdout.splitlines()) == 3
    assert run.returncode == 141  # 128 + SIGPIPE, as `seq 1 100000 | head -n 3` ends
