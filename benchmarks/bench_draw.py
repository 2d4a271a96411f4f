"""Drawing time for a ~2,000-op graph: DOT text, and SVG through Graphviz's ``dot``.

Two ~2,000-op models: a 74-layer GPT-style decoder (nested module clusters, residual edges)
and a 1,000-layer Linear+ReLU MLP (a long flat chain). Times are medians; the plain forward
is measured in the same run for scale. Run: ``python benchmarks/bench_draw.py [--repeats N]``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from functools import partial
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from models import GPTDecoder  # noqa: E402
from timing import median_seconds  # noqa: E402

import torchlens as tl  # noqa: E402


def gpt_2000() -> tuple[nn.Module, tuple]:
    """A narrow GPT decoder with 74 blocks: 2,004 ops."""
    torch.manual_seed(0)
    model = GPTDecoder(vocab_size=100, d_model=32, n_layers=74, n_heads=4, context=16)
    return model.eval(), (torch.randint(0, 100, (2, 16)),)


def mlp_2000() -> tuple[nn.Module, tuple]:
    """1,000 Linear(16, 16) + ReLU layers: 2,000 ops."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(1000):
        layers += [nn.Linear(16, 16), nn.ReLU()]
    return nn.Sequential(*layers).eval(), (torch.randn(2, 16),)


VARIANTS = {
    "full": {},
    "depth=1": {"depth": 1},
    "collapse_repeats": {"collapse_repeats": True},
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    opts = parser.parse_args(argv)
    if shutil.which("dot") is None:
        print("Graphviz `dot` is not installed: only DOT text is timed")
    print(f"{'model':<10}{'ops':>6}{'variant':>18}{'forward ms':>12}{'to_dot ms':>11}{'svg s':>8}")
    with torch.no_grad():
        for name, factory in {"gpt_2000": gpt_2000, "mlp_2000": mlp_2000}.items():
            _bench(name, *factory(), opts.repeats)
    return 0


def _bench(name: str, model: nn.Module, args: tuple, repeats: int) -> None:
    trace = tl.trace(model, args)
    out = Path(tempfile.mkdtemp()) / "graph.svg"
    forward = median_seconds(lambda: model(*args), repeats=repeats)
    for variant, options in VARIANTS.items():
        to_dot = median_seconds(partial(trace.to_dot, **options), repeats=repeats)
        svg = float("nan")
        if shutil.which("dot"):  # one layout each: `dot` dominates and takes seconds
            svg = median_seconds(partial(trace.draw, out, **options), repeats=1, warmup=0)
        print(
            f"{name:<10}{len(trace):>6}{variant:>18}{forward * 1e3:>12.2f}"
            f"{to_dot * 1e3:>11.1f}{svg:>8.2f}"
        )


if __name__ == "__main__":
    raise SystemExit(main())
