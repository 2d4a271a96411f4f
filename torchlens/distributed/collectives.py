"""torch.distributed's collectives as torchlens records and replays them.

Two families reach the capture mode: the functional collectives (``torch.ops._c10d_functional``,
which ``DTensor`` redistribution and tensor parallel use; they return a new tensor still being
written) and the c10d calls (``dist.all_gather_into_tensor(out, x)``, what FSDP2 and DDP issue;
they write their first argument and return a ``Work`` or nothing). For each this module fills
the generic registries of capture and replay:

- ``capture.special.SETTLES``: wait for the call before its outputs are recorded, and after
  each rerun, so the saved values are the written ones and no wait is left pending at exit;
- the c10d calls are named ``c10d_<name>`` and recorded as writing their first argument
  (``special.side_writes``), so the tensor they filled is an output of the call;
- ``replay.exemptions.PROVEN_BY_RULE``: their edges are proven by their definition, not probed
  (a probe would need every rank to probe alike); their values are still replayed;
- ``replay.interpreter.LOCKSTEP``: before each rerun every rank checks that all ranks reached
  the same collective (:mod:`torchlens.distributed.lockstep`).

Registering changes nothing in torch; it only tells torchlens what these functions are.
"""

from __future__ import annotations

from typing import Any

import torch

from torchlens.capture import FUNC_INFOS, SETTLES, SPECIAL_OUTPUTS, FuncInfo, side_writes
from torchlens.distributed.lockstep import check_lockstep
from torchlens.distributed.release import restore_groups
from torchlens.replay import LOCKSTEP, PROVEN_BY_RULE, RESTORES

__all__ = ["COLLECTIVE_RULE", "FUNCTIONAL", "C10D", "register", "is_collective"]

COLLECTIVE_RULE = (
    "a collective's output is by its definition a function of every element each rank "
    "sends (a sum, a gather, a scatter): its edges hold by that rule, and its value is "
    "replayed once per rank, in lockstep"
)

# functional collectives (torch.ops._c10d_functional): they return new tensors
FUNCTIONAL = (
    "all_reduce", "all_reduce_coalesced", "all_gather_into_tensor",
    "all_gather_into_tensor_coalesced", "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced", "all_to_all_single",
)  # fmt: skip
# c10d calls that write their first argument (and return a Work, or None)
C10D = (
    "all_reduce", "broadcast", "reduce", "all_gather_into_tensor", "all_gather_single",
    "reduce_scatter_tensor", "reduce_scatter_single", "all_to_all_single",
)  # fmt: skip

_FUNCS: set[Any] = set()


def _wait_tensors(result: Any) -> None:
    """Settle a functional collective: wait for each tensor it returned."""
    wait = torch.ops._c10d_functional.wait_tensor
    for tensor in result if isinstance(result, (list, tuple)) else (result,):
        if isinstance(tensor, torch.Tensor):
            wait(tensor)


def _wait_work(result: Any) -> None:
    """Settle a c10d call made with ``async_op=True``: wait for its ``Work``."""
    wait = getattr(result, "wait", None)
    if wait is not None:
        wait()


def _add(func: Any, settle: Any) -> None:
    SETTLES[func] = settle
    PROVEN_BY_RULE[func] = COLLECTIVE_RULE
    LOCKSTEP[func] = check_lockstep
    _FUNCS.add(func)


def register() -> None:
    """Tell capture and replay about the collectives of this torch build (idempotent; a
    build without ``torch.distributed`` has none)."""
    if _FUNCS or not torch.distributed.is_available():
        return
    import torch.distributed as dist

    ops = torch.ops._c10d_functional
    for name in FUNCTIONAL:
        packet = getattr(ops, name, None)
        if packet is None:
            continue
        _add(packet, _wait_tensors)
        for overload in packet.overloads():
            _add(getattr(packet, overload), _wait_tensors)
    for name in C10D:
        func = getattr(dist, name, None)
        if func is None:
            continue
        label = f"c10d_{name}"
        FUNC_INFOS[func] = FuncInfo(label, (0,), False, False, settles=True)
        SPECIAL_OUTPUTS[label] = side_writes((0,))
        _add(func, _wait_work)
        RESTORES[func] = restore_groups  # its group= kept by name (distributed/release.py)


def is_collective(op: Any) -> bool:
    """Whether ``op`` is a recorded collective (either family)."""
    try:
        return op.func in _FUNCS
    except TypeError:
        return False
