"""Validation cost: median plain forward vs ``tl.validate`` on the benchmark transformers.

``tl.validate`` captures the forward, lints it, replays every op from its saved parents,
perturbs every tensor edge, and reruns the pristine model. The ratio is against a plain
forward measured in the same round: each round runs all four in turn, and the median of the
per-round ratios is reported (the machine's speed drifts too much for a ratio of medians).
Targets (issue 14): at most 3x on the transformer encoder and 4x on the GPT decoder; the
conv net (convolutions, batch norms) has no target and is reported beside them. The LRN net
(``Conv2d -> ReLU -> CrossMapLRN2d``, issue 38) is a loop of small in-place writes through
views of one large tensor: validation's cost must follow the forward's there too, within
the multiple of the real-model zoo's median model (its target; ``--models lrn_convnet``);
``lrn_convnet_128`` is the same at 128 px, where the forward's time is its kernels'.
The force field (issue 51) takes forces = -dE/dx with ``torch.autograd.grad`` inside its
forward, which validation replays by re-running and differentiating the recorded sub-graph
(once per probe of the gradient op's edges); it is reported beside the zoo's median.
A breakdown separates the capture (``tl.trace``) from the model-free arms
(``check_trace``: lint, replay + perturbation), also given per op (median microseconds).
``floor x`` is the least any validation of this design costs, from floors measured in the
same rounds (``floors.py``): one plain forward (the ground-truth rerun), plus the graph floor
(the leanest pure-Python capture with edges and module calls, every output kept), plus the
replay floor (every recorded call rerun once from its saved values and compared, as the
replay arm does: refreshes kept as writes made once, uninitialised memory not compared),
before a single edge is perturbed. A target below it is marked so: no pure-Python work can
meet it. ``probe floor x`` adds the perturbation arm's least work to it (``check_floor``:
the replay floor with, in the same pass, each edge the arm can only prove with a call
probed once, at the first point and by the code the arm uses): where kernels dominate the
arm runs at about that floor, so it measures how far a Python-bound model's target is out
of reach of per-edge probing, not a strict bound.
Times are the thread's CPU time on one torch thread by default (as in ``bench_hf.py``): on
a shared machine, time spent descheduled is then not counted against any arm.
With ``--device cuda`` (a GPU must be present) the models and inputs move to the GPU, every
timed run ends with ``torch.cuda.synchronize()``, and the wall clock times them.
Run: ``python benchmarks/bench_validate.py [--repeats N] [--threads N] [--clock thread|wall]
[--device cuda]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from floors import check_floor, graph_floor, replay_floor  # noqa: E402
from models import (  # noqa: E402
    convnet8,
    force_field,
    gpt_decoder,
    lrn_convnet,
    lrn_convnet_128,
    transformer_encoder,
)
from timing import interleaved_times, median_seconds, synchronized  # noqa: E402

import torchlens as tl  # noqa: E402
from torchlens.replay import check_trace  # noqa: E402

MODELS = {
    "transformer_encoder": transformer_encoder,
    "gpt_decoder": gpt_decoder,
    "convnet8": convnet8,
    "lrn_convnet": lrn_convnet,
    "lrn_convnet_128": lrn_convnet_128,
    "force_field": force_field,
}
TARGETS: dict[str, float | None] = {
    "transformer_encoder": 3.0,
    "gpt_decoder": 4.0,
    "convnet8": None,
    # the zoo's median validate multiple (bench_realworld.py --threads 1 --repeats 3, the
    # "all" row: 162 models, 9.10x and 9.35x in two runs on 2026-12-05; 8.26x on the 151
    # models of an earlier zoo)
    "lrn_convnet": 9.1,
    "lrn_convnet_128": 9.1,
    "force_field": None,  # reported beside the zoo median (9.1x): no target of its own
}
CLOCKS = {"thread": time.thread_time, "wall": time.perf_counter}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument(
        "--clock", choices=tuple(CLOCKS), default="thread", help="thread CPU time or wall time"
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda (a GPU must be present)")
    parser.add_argument("--models", nargs="+", choices=tuple(MODELS), help="default: all")
    opts = parser.parse_args(argv)
    device = torch.device(opts.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda needs a CUDA build of torch and a GPU")
    clock_name = "wall" if device.type == "cuda" else opts.clock  # kernels run on the GPU's
    torch.set_num_threads(opts.threads)
    print(f"{opts.threads} thread(s), {clock_name} clock, {opts.repeats} rounds, {device}")
    header = ("model", "ops", "forward ms", "trace x", "arms x", "arms us/op", "validate x")
    print(
        "{:<22}{:>6}{:>12}{:>9}{:>8}{:>12}{:>12}{:>9}{:>15}{:>8}".format(
            *header, "floor x", "probe floor x", "target"
        )
    )
    failed = False
    for name, factory in MODELS.items():
        if opts.models and name not in opts.models:
            continue
        ratio = _bench(name, factory, opts.repeats, CLOCKS[clock_name], device)
        target = TARGETS[name]
        failed |= target is not None and ratio > target
    return 1 if failed else 0


def _bench(
    name: str, factory, repeats: int, clock=time.thread_time, device: torch.device | None = None
) -> float:
    """Print one row; returns the validate / forward ratio."""
    model, args = factory()
    if device is not None:
        model, args = model.to(device), tuple(a.to(device) for a in args)
    trace = tl.trace(model, args)
    status = tl.replay(model, args)
    assert status.state == "passed", status
    runs = {
        "forward": lambda: model(*args),
        "trace": lambda: tl.trace(model, args),
        "arms": lambda: check_trace(trace),
        "validate": lambda: tl.validate(model, args),
        "graph": lambda: graph_floor(model, args),
        "replay floor": lambda: replay_floor(trace),
        "check floor": lambda: check_floor(trace),
    }
    if device is not None and device.type == "cuda":
        runs = {key: synchronized(run) for key, run in runs.items()}
    forward_ms = median_seconds(runs["forward"], repeats=5, warmup=1) * 1e3
    times = interleaved_times(runs, repeats=repeats, warmup=1, clock=clock)
    ratios = {
        key: statistics.median(t / b for t, b in zip(ts, times["forward"]))
        for key, ts in times.items()
    }
    ratio = ratios["validate"]
    per_op = statistics.median(times["arms"]) * 1e6 / len(trace)
    floor = 1.0 + ratios["graph"] + ratios["replay floor"]
    probe_floor = 1.0 + ratios["graph"] + ratios["check floor"]
    target = TARGETS[name]
    below = " (below the floor)" if target is not None and target < floor else ""
    print(
        f"{name:<22}{len(trace):>6}{forward_ms:>12.1f}{ratios['trace']:>9.2f}"
        f"{ratios['arms']:>8.2f}{per_op:>12.0f}{ratio:>12.2f}{floor:>9.2f}{probe_floor:>15.2f}"
        f"{target or '-':>8}"
        f"{below}"
    )
    return ratio


if __name__ == "__main__":
    torch.manual_seed(0)
    raise SystemExit(main())
