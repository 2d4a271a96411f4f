"""Interpretability workflows: the cost of opened attention, and of ``trace.rerun``.

Measured in the same run, runs interleaved, ratios taken round by round against a plain
forward, torch on one thread, each run timed by thread CPU time (steady on a shared machine):

* ``attention``: ``tl.trace`` of an ``nn.TransformerEncoder`` (6 layers, d=128, 32 tokens)
  with ``F.multi_head_attention_forward`` opened (the default) and closed (one op). Reports
  ops before/after, each capture's ratio to a forward, and the capture cost per op: opening
  should cost about the extra ops, not more.
* ``rerun``: ``trace.rerun`` of an edit of the last layer's output (before the head) of a
  12-layer model, against a forward of the model (target under 0.2x), and against an edit of
  the first layer's output (a full recompute) for reference.
* ``sweep``: ``edits.sweep`` over 2 blocks x 16 positions of a transformers GPT-2 (2 layers,
  random weights; needs transformers), against the same 32 live interventions
  (``tl.trace(..., intervene=...)``, target: the sweep costs less) and 32 plain forwards.

Run: ``python benchmarks/bench_interpretability.py [--repeats N] [--clock wall]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing import interleaved_times  # noqa: E402

import torchlens as tl  # noqa: E402
from torchlens import edits  # noqa: E402
from torchlens.capture.composite import close_function, open_function  # noqa: E402


def _encoder(layers: int, d: int = 128) -> nn.Module:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, layers, enable_nested_tensor=False).eval()


def _ratios(fns: dict, base: str, repeats: int, clock) -> dict[str, float]:
    times = interleaved_times(fns, repeats=repeats, warmup=2, clock=clock)
    return {
        name: statistics.median(t / b for t, b in zip(ts, times[base]))
        for name, ts in times.items()
    }


def bench_attention(repeats: int, clock) -> None:
    model, x = _encoder(6), torch.randn(4, 32, 128)

    def closed() -> tl.Trace:
        close_function(F.multi_head_attention_forward)
        try:
            return tl.trace(model, x)
        finally:
            open_function(F.multi_head_attention_forward)

    n_open, n_closed = len(tl.trace(model, x)), len(closed())
    with torch.no_grad():
        ratios = _ratios(
            {"forward": lambda: model(x), "opened": lambda: tl.trace(model, x), "closed": closed},
            "forward",
            repeats,
            clock,
        )
    print(f"attention: ops closed {n_closed}, opened {n_open} ({n_open / n_closed:.2f}x)")
    print(f"  capture / forward: closed {ratios['closed']:.2f}x, opened {ratios['opened']:.2f}x")
    per_closed = (ratios["closed"] - 1) / n_closed
    per_open = (ratios["opened"] - 1) / n_open
    print(f"  extra cost per op (in forwards): closed {per_closed:.4f}, opened {per_open:.4f}")


def bench_rerun(repeats: int, clock) -> None:
    model = nn.Sequential(_encoder(12), nn.Linear(128, 10)).eval()
    x = torch.randn(4, 32, 128)
    with torch.no_grad():
        trace = tl.trace(model, x)
    last = {tl.module("0.layers.11").output: edits.scale(0.5)}
    first = {tl.module("0.layers.0").output: edits.scale(0.5)}
    with torch.no_grad():
        ratios = _ratios(
            {
                "forward": lambda: model(x),
                "last": lambda: trace.rerun(last),
                "first": lambda: trace.rerun(first),
            },
            "forward",
            repeats,
            clock,
        )
    print(
        f"rerun (12 layers, {len(trace)} ops) / forward: last-layer edit "
        f"{ratios['last']:.3f}x (target < 0.2), first-layer edit {ratios['first']:.2f}x"
    )


def bench_sweep(repeats: int, clock) -> None:
    try:
        import transformers
    except ImportError:
        print("sweep: skipped (transformers is not installed)")
        return
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=32)
    model = transformers.GPT2LMHeadModel(config).eval()
    clean_ids = torch.randint(0, 100, (1, 16))
    corrupt_ids = clean_ids.clone()
    corrupt_ids[0, 5] = (corrupt_ids[0, 5] + 1) % 100
    with torch.no_grad():
        clean, corrupt = tl.trace(model, clean_ids), tl.trace(model, corrupt_ids)
    sites = {f"h.{i}": tl.module(f"transformer.h.{i}").output for i in range(2)}
    metric = edits.logit_diff(3, 7)
    cells = [
        edits.patch(corrupt, clean, s, positions=[p]) for s in sites.values() for p in range(16)
    ]

    def sweep() -> None:
        edits.sweep(corrupt, clean, sites, metric, positions=range(16), progress=False)

    def live() -> None:
        for edit in cells:
            metric(tl.trace(model, corrupt_ids, intervene=edit).output)

    def forwards() -> None:
        for _ in cells:
            metric(model(corrupt_ids))

    with torch.no_grad():
        ratios = _ratios(
            {"forwards": forwards, "live": live, "sweep": sweep}, "live", repeats, clock
        )
    print(
        f"sweep (GPT-2, 2 blocks x 16 positions = {len(cells)} cells) / {len(cells)} live "
        f"interventions: {ratios['sweep']:.2f}x (target < 1); / {len(cells)} plain forwards: "
        f"{ratios['sweep'] / ratios['forwards']:.2f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--clock", choices=["cpu", "wall"], default="cpu")
    options = parser.parse_args()
    torch.set_num_threads(1)
    clock = time.thread_time if options.clock == "cpu" else time.perf_counter
    bench_attention(options.repeats, clock)
    bench_rerun(options.repeats, clock)
    bench_sweep(options.repeats, clock)


if __name__ == "__main__":
    main()
