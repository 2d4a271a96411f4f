"""``tl.report.doctor()``: the installation checked against what torchlens needs."""

from __future__ import annotations

import platform
import runpy
import sys
from pathlib import Path

import pytest
import torch

import torchlens as tl
from torchlens.report import DoctorReport, doctor, torch_support
from torchlens.report import _doctor as doctor_module


@pytest.mark.parametrize(
    ("version", "status"),
    [
        ("2.1.0", "ok"),
        ("2.5.1+cu121", "ok"),
        ("2.13.0", "ok"),
        ("2.13.0+cpu", "ok"),
        ("2.13.0a0+git1234abc", "ok"),
        ("2.13.1", "newer than tested"),
        ("2.14.0.dev20260101+cu130", "newer than tested"),
        ("3.0.0", "newer than tested"),
        ("2.0.1", "unsupported"),
        ("1.13.1+cu117", "unsupported"),
    ],
)
def test_torch_version_against_supported_range(version, status):
    assert torch_support(version) == status


def test_doctor_reports_this_installation():
    report = tl.report.doctor()
    assert isinstance(report, DoctorReport)
    assert report.torchlens_version == tl.__version__
    assert report.python_version == platform.python_version()
    assert report.torch_version == torch.__version__
    assert report.torch_status == torch_support(torch.__version__)
    assert report.cuda_available == torch.cuda.is_available()
    assert report.ok == (report.torch_status != "unsupported")
    assert "torch>=2.1" in report.supported_range and "2.13.0" in report.supported_range


def test_doctor_prints_a_readable_summary():
    report = doctor()
    text = str(report)
    assert text.startswith("torchlens doctor")
    assert f"torch      {torch.__version__}: {report.torch_status}" in text
    assert f"torchlens  {tl.__version__}" in text
    assert "cuda" in text and "dot (Graphviz)" in text


def test_missing_dot_is_reported_with_install_advice(monkeypatch):
    monkeypatch.setattr(doctor_module.shutil, "which", lambda name: None)
    report = doctor()
    dot = next(p for p in report.optional if p.name.startswith("dot"))
    assert not dot.available
    assert "graphviz" in dot.advice.lower() and "to_dot" in dot.advice
    assert "to fix:" in str(report) and "missing" in str(report)


def test_unsupported_torch_is_flagged(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.0.1")
    report = doctor()
    assert report.torch_status == "unsupported" and not report.ok
    assert "2.0.1: unsupported" in str(report)


def test_cuda_devices_are_listed_when_present(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: f"Fake GPU {i}")
    report = doctor()
    assert report.cuda_available
    assert report.cuda_devices == ("cuda:0 Fake GPU 0", "cuda:1 Fake GPU 1")
    assert "cuda       available (cuda:0 Fake GPU 0, cuda:1 Fake GPU 1)" in str(report)


def test_an_unreadable_driver_is_reported_not_raised(monkeypatch):
    def broken(index):
        raise RuntimeError("driver too old")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", broken)
    assert "driver too old" in doctor().cuda_devices[0]


def test_command_line_doctor_prints_the_report(monkeypatch, capsys):
    if not (Path(tl.__file__).parent / "__main__.py").exists():
        pytest.skip("the command line (python -m torchlens) is not built yet")
    monkeypatch.setattr(sys, "argv", ["torchlens", "doctor"])
    with pytest.raises(SystemExit) as done:  # `python -m torchlens doctor`, in this process
        runpy.run_module("torchlens", run_name="__main__")
    assert done.value.code in (0, None)
    out = capsys.readouterr().out
    assert out.startswith("torchlens doctor") and torch.__version__ in out
