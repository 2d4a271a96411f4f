"""What the debugging workflows cost: ``source=True`` per op, and ``tl.find_nonfinite``.

For each benchmark model, measured in the same run, runs interleaved, medians over rounds:

* ``source``: ``tl.trace(..., source=True)`` against ``tl.trace``, and the source hook's own
  time per op (a Python stack walk up to the model's frame), timed inside real traces;
* ``find_nonfinite``: ``tl.find_nonfinite(model, x, inf=False)`` on a healthy model (it checks
  every op and finds nothing, its worst case; ``inf=False`` because the GPT's causal mask
  holds ``-inf`` on purpose) against ``tl.trace`` and against ``tl.record``. It runs
  ``tl.record``'s lean pass plus one sum per output that may hold a new NaN or infinity
  (``torchlens/debug/_nonfinite_pass.py``), so find/record is what those sums and the
  per-op bookkeeping cost;
* ``record``: ``tl.record(model, x)`` (nothing kept) against the plain forward, for scale.

Run: ``python benchmarks/bench_source.py [--repeats N] [--models a,b]``. Torch runs on one
thread and each run is timed by this thread's CPU time, which keeps the numbers steady on a
shared machine. Every timed run follows an untimed plain forward: a run that follows a full
trace pays for the memory that trace gave back (page faults, cold caches), about 15% on the
GPT, which measured the order of the runs rather than the function (``find_nonfinite``,
timed right after ``source``, read 1.12-1.17 times ``record``; timed right after ``record``
instead, 1.00).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from models import BENCH_MODELS  # noqa: E402

import torchlens as tl  # noqa: E402
import torchlens.capture.api as capture_api  # noqa: E402

DEFAULT_MODELS = ("mlp100", "convnet8", "transformer_encoder", "gpt_decoder")


def hook_seconds_per_op(model, args, rounds: int = 5) -> float:
    """The source hook's own time per op, timed inside real traces (the end-to-end
    difference of two medians is within the noise of a shared machine)."""
    spent, calls = [0.0], [0]
    real = capture_api.make_source_hook

    def timed():
        hook = real()

        def wrapper(op, tensor):
            start = time.perf_counter()
            hook(op, tensor)
            spent[0] += time.perf_counter() - start
            calls[0] += 1

        return wrapper

    capture_api.make_source_hook = timed
    try:
        for _ in range(rounds):
            tl.trace(model, args, source=True)
    finally:
        capture_api.make_source_hook = real
    return spent[0] / calls[0]


def settled_times(
    fns: dict[str, Callable[[], object]], settle: Callable[[], object], repeats: int
) -> dict[str, list[float]]:
    """Each function's thread CPU time, one per round, runs interleaved as in
    ``timing.interleaved_times``, each right after an untimed ``settle()``: what ran before
    a timed run is then the same for every function."""
    for _ in range(2):  # warm-up
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            settle()
            start = time.thread_time()
            fn()
            times[name].append(time.thread_time() - start)
    return times


def measure(name: str, repeats: int) -> dict[str, float]:
    model, args = BENCH_MODELS[name]()
    n_ops = len(tl.trace(model, args, structure_only=True))
    fns = {
        "forward": lambda: model(*args),
        "record": lambda: tl.record(model, args),
        "trace": lambda: tl.trace(model, args),
        "source": lambda: tl.trace(model, args, source=True),
        "find_nonfinite": lambda: tl.find_nonfinite(model, args, inf=False),
    }
    with torch.no_grad():
        times = settled_times(fns, fns["forward"], repeats)
    med = {k: statistics.median(v) for k, v in times.items()}

    def ratio(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(times[a], times[b]))

    return {
        "ops": n_ops,
        "trace_ms": med["trace"] * 1e3,
        "source_us_per_op": hook_seconds_per_op(model, args) * 1e6,
        "source/trace": ratio("source", "trace"),
        "find/trace": ratio("find_nonfinite", "trace"),
        "find/record": ratio("find_nonfinite", "record"),
        "record/forward": ratio("record", "forward"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS))
    opts = parser.parse_args()
    torch.set_num_threads(1)
    columns = ("ops", "trace_ms", "source_us_per_op", "source/trace", "find/trace",
               "find/record", "record/forward")  # fmt: skip
    print(f"{'model':22s}" + "".join(f"{c:>18s}" for c in columns))
    for name in opts.models.split(","):
        row = measure(name, opts.repeats)
        cells = "".join(f"{row[c]:>18d}" if c == "ops" else f"{row[c]:>18.2f}" for c in columns)
        print(f"{name:22s}{cells}", flush=True)


if __name__ == "__main__":
    main()
