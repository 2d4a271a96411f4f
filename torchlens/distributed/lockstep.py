"""Every rank reruns the collectives of a replay together, or none does.

Before a collective is rerun, each rank writes what it is about to run (the op's label,
function and shape) under the same sequence number to the process group's store, then waits
for every other rank's entry, at most :data:`TIMEOUT` seconds. Ranks that wrote something else
(they reached another op: their traces differ) or nothing in time are named in a typed
:class:`~torchlens.errors.DistributedError`, raised on every rank that saw it, instead of a
collective that would wait forever.
"""

from __future__ import annotations

import itertools
import os
from datetime import timedelta
from typing import Any

from torchlens.errors import DistributedError

__all__ = ["check_lockstep", "TIMEOUT"]

# seconds a rank waits for the others at a collective of a replay
TIMEOUT = float(os.environ.get("TORCHLENS_RANK_TIMEOUT", "60"))

_SEQUENCE = itertools.count()  # collectives rerun by this process so far, in every replay


def _describe(op: Any) -> str:
    return f"{op.label} ({op.func_name}, shape {tuple(op.shape)})"


def check_lockstep(op: Any) -> None:
    """Raise unless every rank of the default group is about to rerun the same collective.

    Raises:
        DistributedError: ``ranks_differ`` naming the ranks at another op, or
            ``rank_timeout`` naming those that did not arrive within :data:`TIMEOUT`.
    """
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return  # one process: nothing to agree with
    world, rank = dist.get_world_size(), dist.get_rank()
    if world == 1:
        return
    store = dist.distributed_c10d._get_default_store()
    prefix = f"torchlens/lockstep/{next(_SEQUENCE)}/"
    mine = _describe(op)
    store.set(f"{prefix}{rank}", mine)
    keys = [f"{prefix}{r}" for r in range(world)]
    try:
        store.wait(keys, timedelta(seconds=TIMEOUT))
    except Exception:  # noqa: BLE001 - a timeout (or a store gone with its rank)
        missing = [r for r, key in enumerate(keys) if not _has(store, key)]
        raise DistributedError(
            f"rank {rank} waited {TIMEOUT:g} s at collective {mine} of the replay for ranks "
            f"{missing}, which did not reach it: run tl.validate / tl.replay on every rank "
            "with the same model and inputs of the same shapes (a rank that stopped says why "
            "in its own error), or raise TORCHLENS_RANK_TIMEOUT for a slow rank",
            code="rank_timeout",
        ) from None
    theirs = [store.get(key).decode() for key in keys]
    differ = {r: what for r, what in enumerate(theirs) if what != mine}
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
