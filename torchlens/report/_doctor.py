"""``tl.report.doctor()``: what this installation has, checked against what torchlens needs.

It answers the first questions of any bug report — which torchlens, Python and torch, is the
torch version in the supported range, is CUDA there, can graphs be drawn — without raising.
"""

from __future__ import annotations

import importlib.util
import platform
import re
import shutil
import subprocess
from dataclasses import dataclass, field

import torch

from torchlens._table import format_table
from torchlens._version import __version__

__all__ = [
    "MIN_TORCH",
    "TESTED_THROUGH",
    "DoctorReport",
    "OptionalPiece",
    "doctor",
    "torch_support",
]

MIN_TORCH = (2, 1)  # torch>=2.1, no declared ceiling
TESTED_THROUGH = (2, 13, 0)  # the newest torch the test suite ran on
SUPPORTED_RANGE = "torch>=2.1 (no ceiling), tested through 2.13.0"

_DOT_ADVICE = (
    "install Graphviz to draw graphs: `apt-get install graphviz`, `brew install graphviz`, "
    "`conda install -c conda-forge graphviz`, or see https://graphviz.org/download/; "
    "trace.to_dot() works without it"
)


def torch_support(version: str) -> str:
    """``"ok"``, ``"newer than tested"`` or ``"unsupported"`` for a torch version string.

    Local and pre-release suffixes (``+cpu``, ``.dev2025``, ``a0``) are ignored.

    Example:
        >>> torch_support("2.13.0+cpu"), torch_support("2.14.0.dev20260101"), torch_support("2.0.1")
        ('ok', 'newer than tested', 'unsupported')
    """
    numbers = tuple(int(n) for n in re.findall(r"\d+", version.split("+")[0])[:3])
    if numbers[:2] < MIN_TORCH:
        return "unsupported"
    if numbers > TESTED_THROUGH:
        return "newer than tested"
    return "ok"


@dataclass(frozen=True)
class OptionalPiece:
    """Something torchlens uses when present: a Python package or an external program."""

    name: str
    available: bool
    detail: str  # version or path when available
    needed_for: str
    advice: str = ""  # how to get it, shown when missing


@dataclass(frozen=True)
class DoctorReport:
    """The result of :func:`doctor`; ``print(report)`` shows it as a short table."""

    torchlens_version: str
    python_version: str
    platform: str
    torch_version: str
    torch_status: str  # "ok" | "newer than tested" | "unsupported"
    supported_range: str
    cuda_available: bool
    cuda_version: str | None  # the CUDA torch was built with, if any
    cuda_devices: tuple[str, ...]
    optional: tuple[OptionalPiece, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        """Whether torch is in the supported range (optional pieces do not count)."""
        return self.torch_status != "unsupported"

    def __str__(self) -> str:
        cuda = "available" if self.cuda_available else "not available"
        if self.cuda_available and self.cuda_devices:
            cuda += f" ({', '.join(self.cuda_devices)})"
        lines = [
            "torchlens doctor",
            f"  torchlens  {self.torchlens_version}",
            f"  python     {self.python_version} ({self.platform})",
            f"  torch      {self.torch_version}: {self.torch_status} [{self.supported_range}]",
            f"  cuda       {cuda}"
            + (f", built with CUDA {self.cuda_version}" if self.cuda_version else ""),
            "",
        ]
        rows = [
            (p.name, "yes" if p.available else "missing", p.detail or "-", p.needed_for)
            for p in self.optional
        ]
        lines.append(format_table(("piece", "present", "detail", "used for"), rows))
        advice = [f"  {p.name}: {p.advice}" for p in self.optional if not p.available and p.advice]
        if advice:
            lines += ["", "to fix:", *advice]
        return "\n".join(lines)


def doctor() -> DoctorReport:
    """Inspect this installation; never raises for a missing optional piece.

    Returns:
        A :class:`DoctorReport`; print it for a readable summary.

    Example:
        >>> import torchlens as tl
        >>> report = tl.report.doctor()
        >>> report.torch_status in ("ok", "newer than tested", "unsupported")
        True
    """
    cuda_available = torch.cuda.is_available()
    return DoctorReport(
        torchlens_version=__version__,
        python_version=platform.python_version(),
        platform=platform.platform(terse=True),
        torch_version=torch.__version__,
        torch_status=torch_support(torch.__version__),
        supported_range=SUPPORTED_RANGE,
        cuda_available=cuda_available,
        cuda_version=torch.version.cuda,
        cuda_devices=_cuda_devices() if cuda_available else (),
        optional=(
            _graphviz_program(),
            _package("graphviz", "trace.draw() (Python bindings)", "pip install graphviz"),
            _package("safetensors", "save / load payloads", "pip install safetensors"),
            _package("tqdm", "progress bars in the command line", "pip install tqdm"),
        ),
    )


def _cuda_devices() -> tuple[str, ...]:
    try:
        return tuple(
            f"cuda:{i} {torch.cuda.get_device_name(i)}" for i in range(torch.cuda.device_count())
        )
    except Exception as err:  # a broken driver is something to report, not to raise
        return (f"devices unreadable: {type(err).__name__}: {err}",)


def _package(name: str, needed_for: str, advice: str) -> OptionalPiece:
    if importlib.util.find_spec(name) is None:
        return OptionalPiece(name, False, "", needed_for, advice)
    try:
        from importlib.metadata import version

        detail = version(name)
    except Exception:  # installed without metadata (vendored, editable oddities)
        detail = "installed"
    return OptionalPiece(name, True, detail, needed_for)


def _graphviz_program() -> OptionalPiece:
    path = shutil.which("dot")
    name, needed_for = "dot (Graphviz)", "trace.draw() to SVG/PNG/PDF"
    if path is None:
        return OptionalPiece(name, False, "", needed_for, _DOT_ADVICE)
    try:
        done = subprocess.run([path, "-V"], capture_output=True, text=True, timeout=10)
        found = re.search(r"version\s+(\S+)", done.stderr + done.stdout)
        detail = f"{found.group(1)} at {path}" if found else path
    except (OSError, subprocess.SubprocessError):
        detail = path
    return OptionalPiece(name, True, detail, needed_for)
