"""Validation cost: median plain forward vs ``tl.validate`` on the benchmark transformers.

``tl.validate`` captures the forward, lints it, replays every op from its saved parents,
perturbs every tensor edge, and reruns the pristine model. The ratio is against a plain
forward measured in the same run (interleaved). Target (issue 3): at most 4x.
A breakdown separates the capture (``tl.trace``) from the model-free arms
(``check_trace``: replay + perturbation). Run: ``python benchmarks/bench_validate.py``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from models import gpt_decoder, transformer_encoder  # noqa: E402
from timing import interleaved_medians  # noqa: E402

import torchlens as tl  # noqa: E402
from torchlens.replay import check_trace  # noqa: E402

MODELS = {"transformer_encoder": transformer_encoder, "gpt_decoder": gpt_decoder}
TARGET = 4.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    opts = parser.parse_args(argv)
    header = ("model", "ops", "forward ms", "trace x", "arms x", "validate x", "target")
    print("{:<22}{:>6}{:>12}{:>9}{:>8}{:>12}{:>8}".format(*header))
    failed = False
    for name, factory in MODELS.items():
        ratio = _bench(name, factory, opts.repeats)
        failed |= ratio > TARGET
    return 1 if failed else 0


def _bench(name: str, factory, repeats: int) -> float:
    """Print one row; returns the validate / forward ratio."""
    model, args = factory()
    trace = tl.trace(model, args)
    status = tl.replay(model, args)
    assert status.state == "passed", status
    medians = interleaved_medians(
        {
            "forward": lambda: model(*args),
            "trace": lambda: tl.trace(model, args),
            "arms": lambda: check_trace(trace),
            "validate": lambda: tl.validate(model, args),
        },
        repeats=repeats,
        warmup=1,
    )
    base = medians["forward"]
    ratio = medians["validate"] / base
    print(
        f"{name:<22}{len(trace):>6}{base * 1e3:>12.1f}{medians['trace'] / base:>9.2f}"
        f"{medians['arms'] / base:>8.2f}{ratio:>12.2f}{TARGET:>8}"
    )
    return ratio


if __name__ == "__main__":
    torch.manual_seed(0)
    raise SystemExit(main())
