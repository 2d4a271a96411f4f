"""Write the golden saved trace of a tiny model: ``python tests/golden/make_golden.py``.

The model's weights and input are small integers and halves, so every value it computes is
exact on any CPU: the saved bytes depend only on torch, safetensors and torchlens, never on
the machine. Rerun this script (with torch 2.13.0) when the file format changes on purpose.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch
from torch import nn

GOLDEN = Path(__file__).resolve().parent / "tiny_trace"
TORCH_VERSION = "2.13.0"  # the byte-golden smoke leg pins this release


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)
        with torch.no_grad():
            self.fc.weight.copy_(torch.arange(12.0).reshape(3, 4) - 6)
            self.fc.bias.copy_(torch.tensor([0.5, -1.0, 2.0]))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = torch.relu(self.fc(x))
        return h.t() * 2 + 1, h > 1, h.to(torch.bfloat16)


def write(path: str | Path) -> Path:
    """Trace the tiny model and save it to ``path``; returns the directory."""
    import torchlens as tl

    torch.manual_seed(0)
    model = Tiny().eval()
    x = torch.arange(8.0).reshape(2, 4) - 3
    return tl.save(tl.trace(model, x), path)


if __name__ == "__main__":
    if not torch.__version__.startswith(TORCH_VERSION):
        sys.exit(f"the golden trace is written with torch {TORCH_VERSION}, not {torch.__version__}")
    shutil.rmtree(GOLDEN, ignore_errors=True)
    print(f"wrote {write(GOLDEN)}")
