"""Calls whose output is not simply what they return, keyed by readable function name.

Each entry maps ``(args, result)`` to the ``[(path, tensor), ...]`` that the call produced.
``x[i] = y`` returns ``None`` but produces a new value of ``x``; add such calls here rather
than branching inside the capture mode.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from torchlens.capture.grad_calls import backward_outputs

__all__ = [
    "SETTLES",
    "RELEASES",
    "SPECIAL_OUTPUTS",
    "SIDE_WRITES",
    "side_writes",
    "written_arguments",
]

Outputs = list[tuple[str, torch.Tensor]]


def _written_first_argument(args: tuple, result: Any) -> Outputs:
    """``setitem`` writes into its first argument and returns nothing."""
    target = args[0] if args else None
    return [("0", target)] if isinstance(target, torch.Tensor) else []


# Calls that write into arguments besides what they return, by argument position. Their
# kernels write through data pointers, so the version counters of those arguments do not
# move: the written arguments are outputs of the call (``name:1``...), and a later read of
# them reads the written value, not the one from before the call.
SIDE_WRITES: dict[str, tuple[int, ...]] = {
    # QAT's fused observer: running min/max, scale and zero point (Tensor(a!) in its schema)
    "fused_moving_avg_obs_fake_quant": (3, 4, 5, 6),
    # GradScaler's: the gradients and the found-inf flag; the scale and its tracker
    "_amp_foreach_non_finite_check_and_unscale_": (0, 1),
    "_amp_update_scale_": (0, 1),
}


def written_arguments(positions: tuple[int, ...], args: tuple, result: Any = None) -> Outputs:
    """The outputs of a call that writes the arguments at ``positions``: what it returns
    (when a tensor), then each tensor written, those in a written list one by one."""
    found = [("", result)] if isinstance(result, torch.Tensor) else []
    for i in positions:
        written = args[i] if i < len(args) else None
        if isinstance(written, torch.Tensor):
            if written is not result:  # (an op returning what it wrote: once)
                found.append((str(i), written))
        elif isinstance(written, (list, tuple)):  # _foreach_mul_(tensors, ...)
            found += [(f"{i}.{k}", t) for k, t in enumerate(written)
                      if isinstance(t, torch.Tensor)]  # fmt: skip
    return found


def side_writes(positions: tuple[int, ...]) -> Callable[[tuple, Any], Outputs]:
    """:func:`written_arguments` at ``positions``, as a :data:`SPECIAL_OUTPUTS` entry."""
    return partial(written_arguments, positions)


SPECIAL_OUTPUTS: dict[str, Callable[[tuple, Any], Outputs]] = {
    "setitem": _written_first_argument,
    "set_data": _written_first_argument,  # x.data = value (the setter returns nothing)
    "backward": backward_outputs,  # the .grad it wrote (capture/grad_calls.py)
    **{name: side_writes(positions) for name, positions in SIDE_WRITES.items()},
}

# Calls that return before their outputs are written (torch.distributed's collectives, which
# return a tensor or a ``Work`` still in flight): function -> ``settle(result)``, which waits
# for them. Capture settles such a call before it records the outputs, and replay settles
# each rerun, so both read written values and no wait is left pending at exit. Filled by
# ``torchlens.distributed``, which knows these functions; capture only calls the entry.
SETTLES: dict[Any, Callable[[Any], None]] = {}

# Called with each finished trace that keeps no live autograd graph (``save_grads`` off):
# each may swap values the trace holds for plain ones, so the trace keeps nothing alive of
# the run that made it (torch.distributed's process groups, through the hooks FSDP puts on
# the forward's outputs). Filled by ``torchlens.distributed``; capture only calls them.
RELEASES: list[Callable[[Any], None]] = []
