"""Sparse recording overhead: ``tl.record`` vs a plain forward and vs hand-written hooks.

For each benchmark model, about a tenth of the ops are selected: the outputs of every k-th
module of one type (convolutions, layer norms, linears). Measured in the same run, runs
interleaved, medians after a warm-up:

* ``record``: ``tl.record(model, args, save=tl.label(<those ops>))`` / plain forward
  (target at most 1.10x on the transformer and conv models);
* ``hooks``: forward hooks on the same modules that keep their outputs / plain forward;
  ``record / hooks`` must be at most 1.5;
* ``floor``: those hooks under the counting floor (``floors.py``: a mode that counts each
  call by function and follows module calls by wrapping each ``forward``), the least pure
  Python a recorder that names every op and module call and keeps the same values runs;
* ``module``: ``save=tl.module(...)`` selecting the same module calls (every op inside them);
* ``clone``: the same record, copying each kept value at once instead of copy-on-write;
* ``trace``: full ``tl.trace`` for reference;
* ``stop``: ``tl.trace`` / ``tl.record`` with ``stop_after=`` the first selected op (an early
  layer), against the full trace / full forward: the saving of halting early.

Issue 14's targets for ``record`` are at most 1.05x on the conv and transformer models and
1.2x on mlp100; the last column says which are met, and which lie below ``floor``.

Run: ``python benchmarks/bench_record.py [--repeats N] [--models a,b] [--clock wall]``.
By default torch runs on one thread and each run is timed by that thread's CPU time, which
keeps the ratios steady on a shared, busy machine; ``--clock wall`` times wall clock instead.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from floors import count_floor  # noqa: E402
from models import BENCH_MODELS  # noqa: E402
from timing import interleaved_times, pin_allocator  # noqa: E402

import torchlens as tl  # noqa: E402

record_api = importlib.import_module(
    "torchlens.capture.record"
)  # (the module: capture.record is the function)
from torchlens.capture.record_mode import RecordMode  # noqa: E402

# model -> (module type whose outputs are kept, keep every k-th of them)
SELECTION = {
    "mlp100": (nn.Linear, 5),
    "convnet8": (nn.Conv2d, 3),
    "transformer_encoder": (nn.LayerNorm, 2),
    "gpt_decoder": (nn.Linear, 2),
}
TARGETS = {"convnet8": 1.10, "transformer_encoder": 1.10}  # record / forward
# issue 14's targets for record / forward (reported; the run fails on TARGETS only)
ISSUE_TARGETS = {"mlp100": 1.2, "convnet8": 1.05, "transformer_encoder": 1.05, "gpt_decoder": 1.05}
HOOK_TARGET = 1.5  # record / hand-written hooks


def _selected_modules(model: nn.Module, kind: type, every: int) -> dict[str, nn.Module]:
    found = [(a, m) for a, m in model.named_modules() if a and isinstance(m, kind)]
    return dict(found[::every])


def _output_labels(trace: tl.Trace, addresses: list[str]) -> list[str]:
    labels = []
    for address in addresses:
        for call in trace.module_calls(address):
            labels.extend(call.outputs)
    return labels


def _hooked_forward(model: nn.Module, modules: dict[str, nn.Module], args: tuple) -> dict:
    """What users write by hand: forward hooks that keep the outputs, removed afterwards."""
    saved: dict[str, torch.Tensor] = {}
    handles = [
        module.register_forward_hook(partial(_keep, saved, address))
        for address, module in modules.items()
    ]
    try:
        model(*args)
    finally:
        for handle in handles:
            handle.remove()
    return saved


def _keep(saved: dict, address: str, module: nn.Module, args: tuple, output) -> None:
    saved[address] = output.detach()


def _record_cloning(model, args, save):
    original = record_api.RecordMode
    record_api.RecordMode = partial(RecordMode, clone=True)
    try:
        return tl.record(model, args, save=save)
    finally:
        record_api.RecordMode = original


def ratio(times: dict[str, list[float]], a: str, b: str) -> float:
    """Median over rounds of ``a``'s time over ``b``'s time in the same round."""
    return statistics.median(x / y for x, y in zip(times[a], times[b]))


def bench_model(
    name: str, repeats: int, clock: Callable[[], float]
) -> tuple[dict[str, list[float]], dict[str, int]]:
    model, args = BENCH_MODELS[name]()
    kind, every = SELECTION[name]
    modules = _selected_modules(model, kind, every)
    full = tl.trace(model, args, structure_only=True)
    labels = _output_labels(full, list(modules))
    by_label = tl.label(*labels)
    by_module = None
    for address in modules:
        sel = tl.module(address)
        by_module = sel if by_module is None else by_module | sel
    first = tl.label(labels[0])
    rec = tl.record(model, args, save=by_label)
    assert rec.labels == labels, (rec.labels, labels)
    times = interleaved_times(
        {
            "forward": lambda: model(*args),
            "record": lambda: tl.record(model, args, save=by_label),
            "hooks": lambda: _hooked_forward(model, modules, args),
            "floor": lambda: count_floor(
                model, args, run=lambda: _hooked_forward(model, modules, args)
            ),
            "module": lambda: tl.record(model, args, save=by_module),
            "clone": lambda: _record_cloning(model, args, by_label),
            "trace": lambda: tl.trace(model, args),
            "trace_stop": lambda: tl.trace(model, args, stop_after=first),
            "record_stop": lambda: tl.record(model, args, save=first, stop_after=first),
        },
        repeats=repeats,
        warmup=2,
        clock=clock,
    )
    info = {"ops": len(full), "kept": len(labels), "stop_at": full[labels[0]].index + 1}
    return times, info


_ROW = "{:<20}" + "{:>8}" * 2 + "{:>9}" + "{:>8}" * 6 + "{:>8}{:>7}{:>18}{:>17}"


def _issue_verdict(target: float | None, record: float, floor: float) -> str:
    """``  <=1.05x met`` or ``MISSED``, noting a missed target below the counting floor."""
    if target is None:
        return ""
    if record <= target:
        return f"  <={target:g}x met"
    return f"  <={target:g}x MISSED" + (" (below the floor)" if floor > target else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    parser.add_argument("--models", default=",".join(SELECTION))
    opts = parser.parse_args(argv)
    pin_allocator()  # the same allocator for every arm (timing.pin_allocator)
    clock = time.perf_counter
    if opts.clock == "cpu":
        torch.set_num_threads(1)
        clock = time.thread_time
    head = ("model", "ops", "kept", "fwd ms", "record", "hooks", "rec/hk", "floor", "module")
    head += ("clone", "trace", "stop@", "trace_stop/trace", "record_stop/fwd", "  issue 14")
    print((_ROW + "{}").format(*head))
    failed = False
    for name in opts.models.split(","):
        m, info = bench_model(name, opts.repeats, clock)
        fwd = statistics.median(m["forward"])
        rec, vs_hooks = ratio(m, "record", "forward"), ratio(m, "record", "hooks")
        failed |= rec > TARGETS.get(name, float("inf")) or vs_hooks > HOOK_TARGET
        row = (name, info["ops"], info["kept"], f"{fwd * 1e3:.2f}", f"{rec:.3f}")
        floor = ratio(m, "floor", "forward")
        row += (f"{ratio(m, 'hooks', 'forward'):.3f}", f"{vs_hooks:.3f}", f"{floor:.3f}")
        row += (f"{ratio(m, 'module', 'forward'):.3f}", f"{ratio(m, 'clone', 'forward'):.3f}")
        row += (f"{ratio(m, 'trace', 'forward'):.3f}", info["stop_at"])
        row += (
            f"{ratio(m, 'trace_stop', 'trace'):.3f}",
            f"{ratio(m, 'record_stop', 'forward'):.3f}",
            _issue_verdict(ISSUE_TARGETS.get(name), rec, floor),
        )
        print((_ROW + "{}").format(*row))
    print("record, hooks, floor, module, clone, trace: ratio to the plain forward of the same run")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
