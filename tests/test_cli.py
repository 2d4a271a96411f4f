"""The ``torchlens`` command line: demo, doctor, and trace FILE.py:factory."""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from torchlens.cli import main

USER_FILE = textwrap.dedent(
    """
    import torch
    from torch import nn
    from helper import WIDTH  # a neighbour module, as `python user_model.py` would allow

    def build():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, WIDTH), nn.ReLU(), nn.Linear(WIDTH, 2)).eval()
        return model, (torch.randn(3, 4),)

    def build_kwargs():
        return nn.Linear(4, 2), (), {"input": torch.ones(1, 4)}

    def wrong_shape():
        return nn.Linear(4, 2)

    def crashes():
        raise ValueError("no weights here")

    class Broken(nn.Module):
        def forward(self, x):
            raise RuntimeError("forward exploded")

    def broken_forward():
        return Broken(), (torch.ones(1),)
    """
)


@pytest.fixture
def user_file(tmp_path: Path) -> Path:
    (tmp_path / "helper.py").write_text("WIDTH = 8\n")
    path = tmp_path / "user_model.py"
    path.write_text(USER_FILE)
    return path


def test_trace_prints_summary_and_validation(user_file, capsys):
    assert main(["trace", f"{user_file}:build"]) == 0
    out = capsys.readouterr().out
    assert "Trace: 3 ops" in out
    assert "linear_1" in out and "relu_1" in out and "linear_2" in out
    assert "validation: ReplayStatus: passed (3 ops" in out


def test_validation_that_does_not_pass_exits_1(user_file, capsys, monkeypatch):
    import torchlens as tl

    class Unverified:
        state = "unverified"

        def __str__(self) -> str:
            return "ReplayStatus: unverified (stub)"

    monkeypatch.setattr(tl, "replay", lambda model, args, kwargs: Unverified())
    assert main(["trace", f"{user_file}:build"]) == 1
    assert "validation: ReplayStatus: unverified (stub)" in capsys.readouterr().out


def test_trace_with_kwargs_factory(user_file, capsys):
    assert main(["trace", f"{user_file}:build_kwargs", "--no-validate"]) == 0
    out = capsys.readouterr().out
    assert "Trace: 1 ops" in out and "validation: skipped" in out


def test_trace_saves_and_draws(user_file, tmp_path, capsys):
    saved = tmp_path / "saved"
    args = ["trace", f"{user_file}:build", "--no-validate", "--save", str(saved)]
    if shutil.which("dot"):
        args += ["--draw", str(tmp_path / "graph.svg"), "--depth", "0"]
    assert main(args) == 0
    import torchlens as tl

    loaded = tl.load(saved)
    assert [op.func_name for op in loaded] == ["linear", "relu", "linear"]
    if shutil.which("dot"):
        assert "<svg" in (tmp_path / "graph.svg").read_text()
    assert f"saved: {saved}" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("{file}:nothing", "has no function 'nothing'; callables there: "),
        ("{dir}/missing.py:build", "no such file"),
        ("{file}", "expected FILE.py:factory"),
        ("{file}:wrong_shape", "must return (model, args) or (model, args, kwargs)"),
        ("{file}:crashes", "crashes() failed: ValueError: no weights here"),
    ],
)
def test_bad_file_or_factory_is_a_usage_error(user_file, capsys, target, message):
    target = target.format(file=user_file, dir=user_file.parent)
    assert main(["trace", target]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_import_error_in_user_file_is_a_usage_error(tmp_path, capsys):
    path = tmp_path / "broken.py"
    path.write_text("import torch\nthis is not python\n")
    assert main(["trace", f"{path}:build"]) == 2
    assert "importing" in capsys.readouterr().err


def test_model_that_raises_exits_1_in_one_line(user_file, capsys):
    assert main(["trace", f"{user_file}:broken_forward"]) == 1
    err = capsys.readouterr().err
    assert "RuntimeError: forward exploded while tracing" in err and "Traceback" not in err
    with pytest.raises(RuntimeError, match="forward exploded"):
        main(["trace", f"{user_file}:broken_forward", "--traceback"])


def test_progress_bar_only_on_a_terminal(user_file, capsys, monkeypatch):
    assert main(["trace", f"{user_file}:build", "--no-validate"]) == 0
    assert capsys.readouterr().err == ""

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(["trace", f"{user_file}:build", "--no-validate"]) == 0
    assert "trace" in terminal.getvalue() and "it/s" in terminal.getvalue()


def test_doctor_and_demo(capsys):
    assert main(["doctor"]) == 0
    assert "torchlens doctor" in capsys.readouterr().out
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "Trace:" in out and "passed" in out


def test_no_command_prints_help_and_bad_option_is_usage_error(capsys):
    assert main([]) == 2
    assert "trace" in capsys.readouterr().out
    assert main(["trace"]) == 2  # argparse: missing FILE.py:factory
    assert "FILE.py:factory" in capsys.readouterr().err


def test_python_dash_m_entry_point(user_file):
    done = subprocess.run(
        [sys.executable, "-m", "torchlens", "trace", f"{user_file}:nothing"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "has no function 'nothing'" in done.stderr and "Traceback" not in done.stderr
