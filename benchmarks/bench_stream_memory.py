"""Peak memory of a streamed capture vs an in-memory capture vs a plain forward.

Each mode runs in its own subprocess and reports peak RSS (``resource.getrusage``) above the
RSS it had once the model and input were built. The model is a stack of Linear+ReLU layers
whose activations total several hundred MB; the streamed capture should stay within a small
multiple of the largest single activation, like the plain forward, while the in-memory
capture holds them all. Runs under ``torch.no_grad()``: with autograd on, the graph kept alive
by the returned output holds every activation whatever the capture does.

    python benchmarks/bench_stream_memory.py [--layers 12] [--rows 65536] [--width 128]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time

MB = 1024 * 1024


def _child(mode: str, layers: int, rows: int, width: int, folder: str) -> dict:
    import torch

    import torchlens as tl

    torch.manual_seed(0)
    blocks = [m for _ in range(layers) for m in (torch.nn.Linear(width, width), torch.nn.ReLU())]
    model = torch.nn.Sequential(*blocks).eval()
    x = torch.randn(rows, width)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    start = time.perf_counter()
    with torch.no_grad():
        if mode == "plain":
            model(x)
        elif mode == "memory":
            trace = tl.trace(model, x)
        else:
            trace = tl.trace(model, x, stream_to=folder)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    ops = 2 * layers if mode == "plain" else len(trace)
    return {"mode": mode, "peak_above_base_mb": (peak - base) / MB, "seconds": seconds, "ops": ops}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--rows", type=int, default=65536)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--child", default=None)
    parser.add_argument("--folder", default="")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.child, args.layers, args.rows, args.width, args.folder)))
        return
    activation = args.rows * args.width * 4 / MB
    params = args.layers * (args.width * args.width + args.width) * 4 / MB
    print(
        f"largest activation {activation:.0f} MB, all activations "
        f"{activation * 2 * args.layers:.0f} MB (+ input {activation:.0f} MB), "
        f"parameters {params:.0f} MB"
    )
    results = {}
    for mode in ("plain", "memory", "stream"):
        with tempfile.TemporaryDirectory() as folder:
            cmd = [sys.executable, __file__, "--child", mode, "--folder", f"{folder}/trace",
                   "--layers", str(args.layers), "--rows", str(args.rows),
                   "--width", str(args.width)]  # fmt: skip
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            results[mode] = json.loads(out.strip().splitlines()[-1])
    plain = results["plain"]["seconds"]
    for mode, r in results.items():
        print(
            f"{mode:>7}: peak +{r['peak_above_base_mb']:7.0f} MB "
            f"({r['peak_above_base_mb'] / activation:5.1f} x largest activation), "
            f"{r['seconds']:.2f} s ({r['seconds'] / plain:5.1f} x plain forward), "
            f"{r['ops']} ops"
        )


if __name__ == "__main__":
    main()
