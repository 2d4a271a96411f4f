"""The spec's PyTorch-backend tutorial, run verbatim.

``TUTORIAL`` is the exact text of the tutorial in the spec (``spec/pytorch-backend.md``) and of
``examples/tutorial.py``; it is executed as written and every assert in it must hold.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT.parent / "shared" / "spec" / "pytorch-backend.md"

TUTORIAL = (
    "import torch\n"
    "from torch import nn\n"
    "\n"
    "import torchlens as tl\n"
    "from torchlens.backends.registry import get_backend_spec\n"
    "\n"
    "model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)).eval()\n"
    "x = torch.randn(2, 4)\n"
    "\n"
    "trace = tl.trace(model, x)\n"
    "print([op.func_name for op in trace])\n"
    'assert tl.validate(model, x, scope="forward")\n'
    "\n"
    'protocol = get_backend_spec("torch").protocol()\n'
    "print(protocol.name, protocol.maturity, protocol.materialization)\n"
    "reference = protocol.reference_output(model, x, None)\n"
    "captured = protocol.capture(model, x, None)\n"
    "status = protocol.validate(captured, reference)\n"
    'assert status.state == "passed", status\n'
)


def test_tutorial_runs_verbatim_and_prints_sensibly(capsys):
    namespace: dict = {"__name__": "__main__"}
    exec(compile(TUTORIAL, str(ROOT / "examples" / "tutorial.py"), "exec"), namespace)
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["['linear', 'relu', 'linear']", "torch stable tensor"]
    assert namespace["status"].state == "passed"
    assert not isinstance(namespace["status"], bool)


def test_example_file_is_the_tutorial():
    assert (ROOT / "examples" / "tutorial.py").read_text() == TUTORIAL


def test_tutorial_text_is_the_spec_text():
    if not SPEC.exists():
        pytest.skip(f"the spec is not checked out next to the repo ({SPEC})")
    assert TUTORIAL in SPEC.read_text()
