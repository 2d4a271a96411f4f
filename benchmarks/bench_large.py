"""Real-size smoke: a GPT-2-small-sized decoder and a ResNet-50-sized conv net.

Each model runs in its own subprocess (so peak RSS is its own): plain forward, ``tl.trace``,
``tl.replay`` (must pass), ``trace.save`` and ``tl.load`` with every payload read back and
compared bit for bit. Prints times as ratios to the plain forward, and peak RSS.
Run: ``python benchmarks/bench_large.py [--model NAME]``.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from models import LARGE_MODELS  # noqa: E402

import torchlens as tl  # noqa: E402


def _timed(fn):
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def measure(name: str) -> dict:
    """Run every step on one model in this process; returns the figures."""
    model, args = LARGE_MODELS[name]()
    model(*args)  # warm-up; every step below runs with autograd on, as a user's would
    _, forward = _timed(lambda: model(*args))
    rss_model = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    trace, capture = _timed(lambda: tl.trace(model, args))
    status, validate = _timed(lambda: tl.replay(model, args))
    with tempfile.TemporaryDirectory() as tmp:
        _, save = _timed(lambda: trace.save(Path(tmp) / "t"))
        loaded, load = _timed(lambda: tl.load(Path(tmp) / "t"))
        same, read = _timed(
            lambda: all(torch.equal(a.out, b.out) for a, b in zip(trace, loaded) if a.has_out)
        )
    return {
        "model": name,
        "ops": len(trace),
        "forward_s": forward,
        "trace_x": capture / forward,
        "validate_x": validate / forward,
        "validate_state": status.state,
        "save_s": save,
        "load_s": load,
        "read_all_s": read,
        "roundtrip_identical": same,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rss_after_model_mb": rss_model,
        "payload_mb": sum(op.out.numel() * op.out.element_size() for op in trace) / 2**20,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", choices=sorted(LARGE_MODELS))
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.model and opts.json:
        print(json.dumps(measure(opts.model)))
        return 0
    names = [opts.model] if opts.model else list(LARGE_MODELS)
    ok = True
    for name in names:
        out = subprocess.run(
            [sys.executable, __file__, "--model", name, "--json"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        row = json.loads(out.stdout.strip().splitlines()[-1])
        ok &= row["validate_state"] == "passed" and row["roundtrip_identical"]
        print(
            f"{row['model']}: {row['ops']} ops, forward {row['forward_s']:.2f} s, "
            f"trace {row['trace_x']:.2f}x, validate {row['validate_x']:.2f}x "
            f"({row['validate_state']}), save {row['save_s']:.2f} s, load {row['load_s']:.2f} s, "
            f"read all {row['read_all_s']:.2f} s (identical: {row['roundtrip_identical']}), "
            f"payloads {row['payload_mb']:.0f} MB, peak RSS {row['peak_rss_mb']:.0f} MB "
            f"(model loaded: {row['rss_after_model_mb']:.0f} MB)"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
