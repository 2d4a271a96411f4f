"""Capture cost per op in CPU instructions, counted by valgrind's callgrind: deterministic.

Timings on a shared machine move by 5-10% from run to run, more than most single changes to
the per-op path are worth; an instruction count does not move. The model is 100 blocks of
``Linear(8, 8)`` + ``ReLU`` at batch 1 (200 ops, one module call each), where the Python
run per op is all there is, as on a GPU whose kernels are queued: what one op costs in
instructions there is what it costs in time there.

Arms, each counted over ``--runs`` calls after two warm-up calls, the garbage collector off
(a collection landing inside the count would be counted too):

* ``forward``: the plain forward (its row gives instructions per op of the forward itself);
* ``bare``: a ``TorchFunctionMode`` that only calls each function, the floor of any capture;
* ``count`` and ``graph``: the floors of ``floors.py``, what a recorder that names ops and
  module calls (``count``, beside ``record``) and a capture with edges and module calls
  (``graph``, beside ``trace``) cannot skip;
* ``record``: ``tl.record`` keeping one op; ``struct``: ``tl.trace(structure_only=True)``;
  ``trace``: ``tl.trace``.

Every arm but ``forward`` is reported as instructions per op over the plain forward.
Run: ``python benchmarks/bench_instructions.py [--runs N] [--arms a,b,...]`` (needs
``valgrind`` on the PATH; each arm takes one to two minutes under it, most of it importing
torch).
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ARMS = ("forward", "bare", "count", "graph", "record", "struct", "trace")
N_OPS = 200
# callgrind starts counting when a C function of this name is entered and stops when it
# returns: the timed calls run inside functools.reduce, a C function called nowhere else
_TOGGLE = "functools_reduce"


def _count(arm: str, runs: int) -> None:
    """Run ``arm`` ``runs`` times inside the toggle function (under callgrind)."""
    import torch
    from torch import nn
    from torch.overrides import TorchFunctionMode

    import torchlens as tl

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from floors import count_floor, graph_floor

    torch.set_num_threads(1)
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(N_OPS // 2):
        layers += [nn.Linear(8, 8), nn.ReLU()]
    model = nn.Sequential(*layers).eval()
    x = torch.randn(1, 8)

    class Bare(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    def bare() -> None:
        with Bare():
            model(x)

    call = {
        "forward": lambda: model(x),
        "bare": bare,
        "count": lambda: count_floor(model, (x,)),
        "graph": lambda: graph_floor(model, (x,)),
        "record": lambda: tl.record(model, x, save=tl.label("linear_3")),
        "struct": lambda: tl.trace(model, x, structure_only=True),
        "trace": lambda: tl.trace(model, x),
    }[arm]
    for _ in range(2):
        call()
    gc.collect()
    gc.disable()
    functools.reduce(lambda _, __: call(), range(runs), None)


def _instructions(arm: str, runs: int) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(
            [
                "valgrind", "--tool=callgrind", "--collect-atstart=no",
                f"--toggle-collect={_TOGGLE}", f"--callgrind-out-file={Path(tmp) / 'out'}",
                sys.executable, __file__, "--count", arm, "--runs", str(runs),
            ],
            capture_output=True, text=True, check=False,
            env={**os.environ, "PYTHONHASHSEED": "0"},  # dict layouts, so counts, repeat
        )  # fmt: skip
    found = re.search(r"Collected\s*:\s*(\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"callgrind run of {arm!r} failed:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5, help="calls counted per arm")
    parser.add_argument("--arms", default=",".join(ARMS), help="comma-separated arms")
    parser.add_argument("--count", choices=ARMS, help=argparse.SUPPRESS)  # the child run
    opts = parser.parse_args(argv)
    if opts.count:
        _count(opts.count, opts.runs)
        return 0
    arms = [a for a in opts.arms.split(",") if a]
    unknown = sorted(set(arms) - set(ARMS))
    if unknown:
        parser.error(f"unknown arms {unknown}; choose from {', '.join(ARMS)}")
    if shutil.which("valgrind") is None:
        print("valgrind is not installed: install it (apt install valgrind) to count")
        return 2
    per_op = {}
    forward = _instructions("forward", opts.runs) / (opts.runs * N_OPS)
    print(f"{N_OPS} ops, {opts.runs} runs per arm; instructions per op")
    print(f"{'forward':<10}{forward:>12,.0f}  (the plain forward itself)")
    for arm in arms:
        if arm == "forward":
            continue
        per_op[arm] = _instructions(arm, opts.runs) / (opts.runs * N_OPS) - forward
        print(f"{arm:<10}{per_op[arm]:>12,.0f}  over the forward")
    return 0


if __name__ == "__main__":
    sys.exit(main())
