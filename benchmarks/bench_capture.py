"""Full-capture overhead: median plain forward vs ``tl.trace`` (every activation saved).

Targets (issue 2): at most 1.5x on the transformer and conv models, at most 3x on the
100-layer MLP. Run: ``python benchmarks/bench_capture.py [--repeats N]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from models import BENCH_MODELS  # noqa: E402
from timing import interleaved_medians  # noqa: E402

import torchlens as tl  # noqa: E402

# Issue 2's targets; the GPT-style decoder (many small ops) is reported without one.
TARGETS = {"mlp100": 3.0, "convnet8": 1.5, "transformer_encoder": 1.5}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--structure-only", action="store_true")
    parser.add_argument("--no-grad", action="store_true", help="run under torch.no_grad()")
    opts = parser.parse_args(argv)
    torch.set_grad_enabled(not opts.no_grad)
    print(
        f"{'model':<22}{'ops':>6}{'forward ms':>12}{'trace ms':>10}{'ratio':>8}"
        f"{'us/op':>8}{'target':>8}"
    )
    failed = False
    for name, factory in BENCH_MODELS.items():
        model, args = factory()
        n_ops = len(tl.trace(model, args, structure_only=opts.structure_only))
        medians = interleaved_medians(
            {
                "forward": lambda m=model, a=args: m(*a),
                "trace": lambda m=model, a=args: tl.trace(m, a, structure_only=opts.structure_only),
            },
            repeats=opts.repeats,
        )
        ratio = medians["trace"] / medians["forward"]
        target = TARGETS.get(name)
        failed |= target is not None and ratio > target
        per_op = (medians["trace"] - medians["forward"]) / n_ops * 1e6  # capture cost per op
        print(
            f"{name:<22}{n_ops:>6}{medians['forward'] * 1e3:>12.2f}"
            f"{medians['trace'] * 1e3:>10.2f}{ratio:>8.2f}{per_op:>8.1f}{target or '-':>8}"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
