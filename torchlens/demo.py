"""The README's main job: trace, validate and summarise a small built-in model.

Run it with ``python -m torchlens demo`` (or ``python -m torchlens.demo``).
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["DemoNet", "main"]


class DemoNet(nn.Module):
    """A small conv net with a residual connection, an in-place ReLU and a two-layer head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8))
        self.act = nn.ReLU(inplace=True)
        self.block = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.ReLU())
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(8 * 8 * 8, 16), nn.Linear(16, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(self.stem(x))
        x = x + self.block(x)
        x = nn.functional.max_pool2d(x, 2)
        return self.head(x).softmax(dim=-1)


def main() -> int:
    """Trace, validate and summarise :class:`DemoNet`; returns a process exit code."""
    import torchlens as tl

    torch.manual_seed(0)
    model = DemoNet().eval()
    x = torch.randn(2, 3, 16, 16)
    trace = tl.trace(model, x)
    print(trace.summary())
    status = tl.replay(model, x)  # what tl.validate(model, x) reduces to a bool
    print(f"\nvalidation: {status}")
    return 0 if status else 1


if __name__ == "__main__":
    raise SystemExit(main())
