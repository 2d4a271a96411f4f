"""Grouping layers and passes (``trace.layers``) against the capture it follows.

Layers are computed after capture, on first use (``torchlens/layers.py``), in time linear in
the ops; capture itself pays nothing for them. This times, on traces of about 10,000 ops,
``tl.trace`` (structure only and with values) and the grouping of the finished trace, and
reports grouping / capture. Three shapes of trace:

* ``rnn_loop``: a hand-written LSTM-like cell (Linears and weight-free gates) run 500 steps
  in a Python loop: nearly every op is a pass of a 500-pass layer;
* ``deep_mlp``: 5,000 Linear + ReLU pairs, no loop: 10,000 layers of one pass;
* ``shared_depth``: one block applied 1,250 times (ALBERT-style), 8 ops per call.

Measured (2-core shared CPU under load, medians of 5, three runs each against the code
before): grouping is 7-9% of the structure-only capture of ``rnn_loop`` (6 ms; was 10-18),
10-15% of ``shared_depth`` (12-20 ms; was 14-18) and 14-20% of ``deep_mlp`` (30-42 ms; was
29-48), whose 10,000 one-op module calls leave little to share; less against ``tl.trace``
with values. The grouping pauses the cyclic collector (``torchlens/_gc.py``): the first
grouping after capturing ``deep_mlp`` took 260 ms with a 210 ms full collection, now 35.
On the real-model zoo it is mostly under 10% of the structure-only capture.
Run:
``python benchmarks/bench_layers.py [--repeats N]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torchlens as tl  # noqa: E402
from torchlens.layers import group_layers  # noqa: E402


class Cell(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ih, self.hh = nn.Linear(16, 64), nn.Linear(16, 64)

    def forward(self, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor):
        i, f, g, o = (self.ih(x) + self.hh(h)).chunk(4, -1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c), c


class RNNLoop(nn.Module):
    def __init__(self, steps: int) -> None:
        super().__init__()
        self.steps, self.cell = steps, Cell()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = c = torch.zeros(x.shape[0], 16)
        for t in range(self.steps):
            h, c = self.cell(x[:, t % x.shape[1]], h, c)
            h = h * 0.9
        return h


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.norm = nn.Linear(16, 32), nn.Linear(32, 16), nn.LayerNorm(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.b(torch.relu(self.a(x)))) * 0.5


class SharedDepth(nn.Module):
    def __init__(self, depth: int) -> None:
        super().__init__()
        self.depth, self.block = depth, Block()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.depth):
            x = self.block(x)
        return x


def cases() -> dict[str, tuple[nn.Module, torch.Tensor]]:
    torch.manual_seed(0)
    mlp = nn.Sequential(*[m for _ in range(5000) for m in (nn.Linear(8, 8), nn.ReLU())])
    return {
        "rnn_loop": (RNNLoop(500).eval(), torch.randn(4, 10, 16)),
        "deep_mlp": (mlp.eval(), torch.randn(4, 8)),
        "shared_depth": (SharedDepth(1250).eval(), torch.randn(4, 16)),
    }


def _median(fn, repeats: int, *args) -> float:
    times = []
    for _ in range(repeats):
        start = time.process_time()
        fn(*args)
        times.append(time.process_time() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{'case':<13} {'ops':>6} {'layers':>7} {'struct ms':>10} {'trace ms':>9} "
          f"{'group ms':>9} {'group/struct':>12} {'group/trace':>11}")  # fmt: skip
    for name, (model, x) in cases().items():
        with torch.no_grad():
            struct = _median(partial(tl.trace, structure_only=True), args.repeats, model, x)
            traced = _median(tl.trace, args.repeats, model, x)
            trace = tl.trace(model, x, structure_only=True)
        group = _median(group_layers, args.repeats, trace)
        layers = group_layers(trace)
        print(f"{name:<13} {len(trace):>6} {len(layers):>7} {struct * 1e3:>10.0f} "
              f"{traced * 1e3:>9.0f} {group * 1e3:>9.1f} {group / struct:>11.1%} "
              f"{group / traced:>11.1%}")  # fmt: skip


if __name__ == "__main__":
    main()
