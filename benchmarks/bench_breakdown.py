"""Capture cost by item: an op, a module call, a parameter's first read, a module wrapped but
never called, and the fixed cost of one capture.

``bench_capture.py`` gives one number per model, microseconds per op over the forward, which
mixes all of these. Here each item is priced by a pair of synthetic models that differ in that
item only, on tensors of eight elements, so that the Python run per item is all there is (as on
a GPU whose kernels are queued):

* ``op``: one module calling ``torch.relu`` ``1 + n`` times, against one call;
* ``functional op``: ``n`` calls of ``F.relu`` against ``n`` of ``torch.relu``: what an op
  costs more when it comes through a function written in Python, as most of
  ``torch.nn.functional`` is (torch's own ``handle_torch_function``, which the graph floor
  pays too, and the keywords it passes on);
* ``module call``: ``n`` modules in a row, each calling ``torch.relu`` once, against one module
  making the same ``n`` calls (the wrapper's install and removal included);
* ``wrapped module``: one call among ``n`` submodules that are never called, against none:
  what installing and removing a module's wrapper costs;
* ``parameter``: ``F.linear`` over ``n`` distinct weights, against one weight ``n`` times (the
  source each parameter becomes when first read);
* ``fixed``: the whole cost over the forward of capturing one call of one module.

Each item is timed for ``tl.trace``, ``tl.trace(structure_only=True)`` and the graph floor of
``floors.py`` (parents by identity, outputs kept, module stack followed): the floor's column is
what any capture with edges and module calls pays for the same item. Per round, every model and
arm of one item runs in turn on the thread's CPU clock; an item's cost is the median over
rounds of ``((arm - forward) of the model - (arm - forward) of its pair) / n``.

Run: ``python benchmarks/bench_breakdown.py [--items N] [--repeats R]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import torchlens as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from floors import graph_floor  # noqa: E402
from timing import interleaved_times  # noqa: E402

__all__ = ["ITEMS", "item_models", "main"]

WIDTH = 8  # elements per tensor: small enough that kernels cost next to nothing


class Calls(nn.Module):
    """One module calling ``torch.relu`` ``n`` times."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.n):
            x = torch.relu(x)
        return x


class FunctionalCalls(Calls):
    """One module calling ``F.relu`` ``n`` times: a function written in Python, which reaches
    a torch function mode through torch's Python ``handle_torch_function`` (with its
    ``inplace=False`` keyword), where ``torch.relu`` reaches it from C++."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.n):
            x = F.relu(x)
        return x


class Idle(nn.Module):
    """One ``torch.relu`` call, beside ``n`` submodules that are never called."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.unused = nn.ModuleList(Calls(1) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)


class Linears(nn.Module):
    """``F.linear`` ``n`` times, over ``n`` distinct weights or one weight throughout."""

    def __init__(self, n: int, distinct: bool) -> None:
        super().__init__()
        count = n if distinct else 1
        self.weights = nn.ParameterList(torch.randn(WIDTH, WIDTH) / WIDTH for _ in range(count))
        self.order = [i % count for i in range(n)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = list(self.weights)
        for i in self.order:
            x = F.linear(x, weights[i])
        return x


# item -> (its model, the pair it is priced against) for n items; None: against nothing
ITEMS: dict[str, Callable[[int], tuple[nn.Module, nn.Module | None]]] = {
    "op": lambda n: (Calls(1 + n), Calls(1)),
    "functional op": lambda n: (FunctionalCalls(n), Calls(n)),
    "module call": lambda n: (nn.Sequential(*(Calls(1) for _ in range(n))), Calls(n)),
    "wrapped module": lambda n: (Idle(n), Idle(0)),
    "parameter": lambda n: (Linears(n, distinct=True), Linears(n, distinct=False)),
    "fixed": lambda n: (Calls(1), None),
}


def item_models(n: int) -> dict[str, tuple[nn.Module, nn.Module | None]]:
    """Each item's model and its pair, in eval mode, built from seed 0."""
    torch.manual_seed(0)
    return {item: tuple(m and m.eval() for m in make(n)) for item, make in ITEMS.items()}


def _arms(model: nn.Module, x: torch.Tensor) -> dict[str, Callable[[], object]]:
    return {
        "forward": lambda: model(x),
        "trace": lambda: tl.trace(model, x),
        "struct": lambda: tl.trace(model, x, structure_only=True),
        "graph": lambda: graph_floor(model, (x,)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--items", type=int, default=200, help="items per model (n)")
    parser.add_argument("--repeats", type=int, default=15, help="timed rounds")
    opts = parser.parse_args(argv)
    if opts.items < 1 or opts.repeats < 1:
        parser.error("--items and --repeats must be at least 1")
    torch.set_num_threads(1)
    x = torch.randn(1, WIDTH)
    print(f"{opts.items} items per model, {opts.repeats} rounds, thread clock; microseconds")
    print(f"{'item':16s} {'trace':>8s} {'struct':>8s} {'graph':>8s}")
    for item, (model, pair) in item_models(opts.items).items():
        # each item in rounds of its own: a large capture just before a small one leaves
        # the caches and the allocator in a state that the small one pays for
        runs = {("item", arm): run for arm, run in _arms(model, x).items()}
        if pair is not None:
            runs.update({("pair", arm): run for arm, run in _arms(pair, x).items()})
        times = interleaved_times(runs, repeats=opts.repeats, clock=time.thread_time)
        count = 1 if pair is None else opts.items
        cells = []
        for arm in ("trace", "struct", "graph"):
            per_round = []
            for r in range(opts.repeats):
                over = times["item", arm][r] - times["item", "forward"][r]
                if pair is not None:
                    over -= times["pair", arm][r] - times["pair", "forward"][r]
                per_round.append(over / count * 1e6)
            cells.append(f"{statistics.median(per_round):8.2f}")
        print(f"{item:16s} {' '.join(cells)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
