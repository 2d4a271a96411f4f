"""What the processes of a ``torchrun`` extraction say to each other.

Every rank checks that all were given the same run (``agree``), rank 0 alone prepares and
finishes the directory while the others wait for its outcome (``on_rank0``), and after the
batches every rank learns whether another one failed (``settle``): so each process raises
the same typed error instead of waiting on a peer that is gone. With one process these are
no-ops that only re-raise. A failed collective (a peer that died) becomes
:class:`~torchlens.errors.ExtractionError` ``distributed``.
"""

from __future__ import annotations

import atexit
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torchlens.errors import ExtractionError, TorchLensError
from torchlens.extract._batches import describe_error
from torchlens.extract._store import RUN

__all__ = ["agree", "on_rank0", "check_shared", "settle"]

_SHARED_WAIT = 10.0  # seconds a rank waits to see the run record rank 0 wrote

# what one rank's failure looks like to the others: the typed error itself (it pickles with
# its code) or, for any other exception, its description
Outcome = tuple[TorchLensError | None, str] | None


def _collective(what: str, call: Callable[[], Any]) -> None:
    try:
        call()
    except Exception as err:
        raise ExtractionError(
            f"another process of this run stopped or could not be reached while {what} "
            f"({describe_error(err)}); every process of the group must call tl.extract, which "
            "splits the batches between them (to extract on one process only, run it outside "
            "torch.distributed), and a process that stopped says why in its own error: fix "
            "that and rerun tl.extract with the same arguments on every process",
            code="distributed",
        ) from err


_SIDE: dict[str, Any] = {}  # the default group it was made for, and the gloo group


def _group() -> Any:
    """The group for these few small messages: a gloo group beside a NCCL default group (whose
    object collectives would need each rank's GPU set as the current device), made once."""
    import torch.distributed as dist

    if dist.get_backend() == "gloo":
        return None
    if _SIDE.get("world") is not dist.group.WORLD:
        try:
            side = dist.new_group(backend="gloo")
        except Exception:  # a build without gloo: the default group it is
            side = None
        if not _SIDE:  # let go of it at exit, not while the interpreter tears torch down
            atexit.register(_SIDE.clear)
        _SIDE.update(world=dist.group.WORLD, group=side)
    return _SIDE["group"]


def _gather(world: int, obj: Any, what: str) -> list[Any]:
    import torch.distributed as dist

    out: list[Any] = [None] * world
    _collective(what, lambda: dist.all_gather_object(out, obj, group=_group()))
    return out


def agree(world: int, root: Path, args: dict[str, Any], overwrite: bool, order: str | None) -> None:
    """Raise ``ranks_differ`` on every rank unless all ranks run the same extraction: the
    same ``to=`` directory, arguments, model parameters and (for a loader) batches."""
    if world == 1:
        return
    mine = {"to": os.path.abspath(root), "overwrite": overwrite, "batches": order, **args}
    everyone = _gather(world, mine, "comparing the ranks' arguments")
    differences = []
    for key in mine:
        ranks_by_value: dict[str, list[int]] = {}
        for r, theirs in enumerate(everyone):
            ranks_by_value.setdefault(repr(theirs.get(key)), []).append(r)
        if len(ranks_by_value) > 1:
            shown = [f"{v} on ranks {_ranks(rs)}" for v, rs in list(ranks_by_value.items())[:4]]
            differences.append(f"{key}: " + ", ".join(shown))
    if differences:
        raise ExtractionError(
            "the processes of this distributed run were given different runs ("
            + "; ".join(differences)
            + "); every rank must call tl.extract with the same to= (one directory, not one "
            "per rank), the same model weights (seed or load them alike), the same unsharded "
            "data and the same arguments: each rank then runs its own share of the batches",
            code="ranks_differ",
        )


def _ranks(ranks: list[int]) -> str:
    return str(ranks) if len(ranks) <= 8 else f"[{ranks[0]}, ... {ranks[-1]}] ({len(ranks)})"


def on_rank0(world: int, rank: int, fn: Callable[[], Any]) -> None:
    """Run ``fn`` on rank 0; every rank raises what it raised (after it finished)."""
    failure = None
    if rank == 0:
        try:
            fn()
        except Exception as err:
            failure = err
    if world > 1:
        import torch.distributed as dist

        box = [_outcome(failure)]
        _collective("waiting for rank 0 to prepare or finish the run directory",
                    lambda: dist.broadcast_object_list(box, src=0, group=_group()))  # fmt: skip
        if rank != 0 and box[0] is not None:
            raise _as_error(box[0], 0, named=False)
    if failure is not None:
        raise failure


def check_shared(world: int, root: Path) -> None:
    """Raise ``ranks_differ`` on every rank unless every rank sees the run record that rank
    0 wrote in ``root`` (a ``to=`` that is not on a filesystem all nodes share)."""
    if world == 1:
        return
    run = root / RUN
    deadline = time.monotonic() + _SHARED_WAIT
    while not run.is_file() and time.monotonic() < deadline:  # a network filesystem may lag
        time.sleep(0.2)
    everyone = _gather(world, run.is_file(), "checking that every rank sees the run directory")
    blind = [r for r, sees in enumerate(everyone) if not sees]
    if blind:
        raise ExtractionError(
            f"ranks {_ranks(blind)} do not see {run}, which rank 0 wrote: to= must be one "
            "directory that every process sees (on several nodes, a shared filesystem)",
            code="ranks_differ",
        )


def settle(world: int, rank: int, failure: BaseException | None) -> None:
    """After the batches: re-raise this rank's failure, or raise another rank's."""
    everyone = [None] if world == 1 else _gather(world, _outcome(failure), "finishing")
    if failure is not None:
        raise failure
    for r, outcome in enumerate(everyone):
        if outcome is not None:
            raise _as_error(outcome, r)


def _outcome(err: BaseException | None) -> Outcome:
    if err is None:
        return None
    return (err if isinstance(err, TorchLensError) else None), describe_error(err)


def _as_error(outcome: tuple[TorchLensError | None, str], rank: int, named: bool = True):
    """Another rank's failure, to raise here: the same type and code (the rank named)."""
    err, text = outcome
    if err is None:
        return ExtractionError(
            f"rank {rank} stopped the run with {text}; its own traceback says where: fix that "
            "and rerun tl.extract with the same arguments",
            code="distributed",
        )
    return type(err)(f"rank {rank} stopped the run: {err}", code=err.code) if named else err
