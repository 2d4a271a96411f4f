"""Every rank of a collective's group reruns it in a replay together, or none does.

Before a collective is rerun, each rank of its process group (the group the op ran in: a
c10d call's ``group=``, a functional collective's group name; the default group when none
is named) writes what it is about to run (the op's label, function and shape) under that
group's next sequence number to the default store, then waits for the entries of the
group's other ranks, at most :data:`TIMEOUT` seconds. Ranks outside the group are not
waited for (they do not run it); each group counts its own collectives. Ranks that wrote
something else (they reached another op: their traces differ) or nothing in time are named
in a typed :class:`~torchlens.errors.DistributedError`, raised on every rank that saw it,
instead of a collective that would wait forever.
"""

from __future__ import annotations

import itertools
import os
from datetime import timedelta
from typing import Any

from torchlens.errors import DistributedError

__all__ = ["check_lockstep", "group_of", "TIMEOUT"]

# seconds a rank waits for the others at a collective of a replay
TIMEOUT = float(os.environ.get("TORCHLENS_RANK_TIMEOUT", "60"))

# group name -> the collectives of that group rerun by this process so far, in every replay
_SEQUENCE: dict[str, itertools.count] = {}


def _describe(op: Any) -> str:
    return f"{op.label} ({op.func_name}, shape {tuple(op.shape)})"


def group_of(op: Any) -> tuple[str, list[int]]:
    """The name and global ranks of the process group the collective ``op`` ran in: the
    group its arguments name (a :class:`~torchlens.distributed.release.GroupRef` kept for a
    c10d call's ``group=``, a ``ProcessGroup``, or a functional collective's group name),
    else the default group."""
    import torch.distributed as dist

    from torchlens.distributed.release import GroupRef

    for value in [*op.kwargs_template.values(), *reversed(op.args_template)]:
        if type(value) is GroupRef:
            return value.name, list(value.ranks)
        if isinstance(value, dist.ProcessGroup):
            return value.group_name, dist.get_process_group_ranks(value)
    from torchlens.distributed.collectives import FUNCTIONAL

    name = op.kwargs_template.get("group_name")
    if name is None and op.func_name in FUNCTIONAL and op.args_template:
        name = op.args_template[-1]  # (a functional collective's last argument)
    if isinstance(name, str):
        from torch.distributed.distributed_c10d import _resolve_process_group

        return name, dist.get_process_group_ranks(_resolve_process_group(name))
    world = dist.group.WORLD
    return world.group_name, list(range(dist.get_world_size()))


def check_lockstep(op: Any) -> None:
    """Raise unless every rank of ``op``'s process group (:func:`group_of`) is about to
    rerun the same collective.

    Raises:
        DistributedError: ``ranks_differ`` naming the ranks at another op, or
            ``rank_timeout`` naming those that did not arrive within :data:`TIMEOUT`.
    """
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return  # one process: nothing to agree with
    rank = dist.get_rank()
    name, ranks = group_of(op)
    if len(ranks) == 1 or rank not in ranks:
        return  # a group of one: nothing to agree with
    store = dist.distributed_c10d._get_default_store()
    prefix = f"torchlens/lockstep/{name}/{next(_SEQUENCE.setdefault(name, itertools.count()))}/"
    mine = _describe(op)
    store.set(f"{prefix}{rank}", mine)
    keys = [f"{prefix}{r}" for r in ranks]
    try:
        store.wait(keys, timedelta(seconds=TIMEOUT))
    except Exception:  # noqa: BLE001 - a timeout (or a store gone with its rank)
        missing = [r for r, key in zip(ranks, keys) if not _has(store, key)]
        raise DistributedError(
            f"rank {rank} waited {TIMEOUT:g} s at collective {mine} of the replay for ranks "
            f"{missing}, which did not reach it: run tl.validate / tl.replay on every rank "
            "with the same model and inputs of the same shapes (a rank that stopped says why "
            "in its own error), or raise TORCHLENS_RANK_TIMEOUT for a slow rank",
            code="rank_timeout",
        ) from None
    theirs = [store.get(key).decode() for key in keys]
    differ = {r: what for r, what in zip(ranks, theirs) if what != mine}
    if differ:
        raise DistributedError(
            f"the ranks reached different collectives at the same point of the replay: rank "
            f"{rank} is at {mine}, "
            + ", ".join(f"rank {r} at {what}" for r, what in differ.items())
            + "; their traces differ before this point (a data-dependent branch, or inputs of "
            "other shapes): compare them with tl.distributed.load_ranks(...).diff(...)",
            code="ranks_differ",
        )


def _has(store: Any, key: str) -> bool:
    try:
        return bool(store.check([key]))
    except Exception:  # noqa: BLE001
        return False
