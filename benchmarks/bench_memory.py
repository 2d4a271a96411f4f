"""Memory across repeated captures: RSS must not grow when each trace is dropped.

Captures the same model 200 times, dropping each trace, and prints the resident set size
after 20, 100 and 200 captures. Growth between 20 and 200 should be noise (a few MB), not
a multiple of one trace's payloads. Run: ``python benchmarks/bench_memory.py``.
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from models import BENCH_MODELS  # noqa: E402

import torchlens as tl  # noqa: E402


def rss_mb() -> float:
    """Current resident set size in MB (Linux /proc; falls back to peak RSS elsewhere)."""
    try:
        with open("/proc/self/statm") as statm:
            pages = int(statm.read().split()[1])
        import os

        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> int:
    model, args = BENCH_MODELS["convnet8"]()
    first = tl.trace(model, args)
    payload_mb = sum(op.out.numel() * op.out.element_size() for op in first) / 2**20
    del first
    marks = {}
    for i in range(1, 201):
        trace = tl.trace(model, args)
        del trace
        if i in (20, 100, 200):
            gc.collect()
            marks[i] = rss_mb()
    growth = marks[200] - marks[20]
    print(f"payloads of one trace: {payload_mb:.1f} MB")
    for i, mb in marks.items():
        print(f"RSS after {i:>3} captures: {mb:8.1f} MB")
    print(f"growth 20 -> 200 captures: {growth:+.1f} MB")
    ok = growth < max(0.5 * payload_mb, 20.0)
    print("ok" if ok else "GROWTH: memory is retained across captures")
    return 0 if ok else 1


if __name__ == "__main__":
    torch.manual_seed(0)
    raise SystemExit(main())
