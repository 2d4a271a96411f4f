"""One view of all ranks: each rank saves its trace, and the rank directories load as one
object.

``save_rank(trace, root)`` writes a rank's trace to ``root/rank<r>`` with which rank wrote it,
the world size and how each ``DTensor`` value is laid out (:mod:`.placements`).
``load_ranks(root)`` reads every rank's directory back as a :class:`RankTraces`: per op, the
record of each rank; a sharded value put back together into the global tensor; and
``tl.diff`` between two ranks, which names the first op where they part ways (a
data-parallel desync, a wrong placement).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from torchlens.distributed.placements import assemble, placement_of
from torchlens.errors import DistributedError, PayloadUnavailableError
from torchlens.trace import Op, Trace

__all__ = ["save_rank", "load_ranks", "RankTraces", "RankOp", "RANK_META"]

RANK_META = "rank"  # the key of trace.meta that save_rank fills
_RANK_DIR = re.compile(r"rank(\d+)")


def _placements(trace: Trace) -> dict[str, dict[str, Any]]:
    """Label -> layout (see :func:`placement_of`) of each ``DTensor`` value of ``trace``."""
    found = {}
    for record in [*trace.sources, *trace.ops]:
        try:
            value = trace.store.get(record.label)
        except PayloadUnavailableError:
            continue
        placement = placement_of(value)
        if placement is not None:
            found[record.label] = placement
    return found


def save_rank(trace: Trace, root: str | os.PathLike) -> Path:
    """Save this rank's ``trace`` to ``root/rank<r>``, with its rank, the world size and the
    layout of its ``DTensor`` values (in ``trace.meta["rank"]``); ``DTensor`` values are
    written as the local shard this rank holds.

    Call it on every rank with the same ``root``; then :func:`load_ranks` reads them as one.

    Args:
        trace: a trace this process captured.
        root: the directory shared by the ranks' directories.

    Returns:
        The directory written.

    Raises:
        DistributedError: ``no_process_group`` when ``torch.distributed`` is not initialized.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise DistributedError(
            "save_rank needs the process group of a torchrun launch (torch.distributed is "
            "not initialized); in one process, save the trace with tl.save",
            code="no_process_group",
        )
    rank, world = dist.get_rank(), dist.get_world_size()
    trace.meta[RANK_META] = {
        "rank": rank,
        "world_size": world,
        "placements": _placements(trace),
    }
    from torchlens.io import save

    return save(trace, Path(root) / f"rank{rank}")


def load_ranks(root: str | os.PathLike) -> RankTraces:
    """Load every rank's trace that :func:`save_rank` wrote under ``root`` as one object.

    Args:
        root: the directory given to :func:`save_rank` on every rank.

    Returns:
        A :class:`RankTraces`, ranks in order.

    Raises:
        DistributedError: ``not_a_rank`` when ``root`` holds no rank directory or one was
            not written by :func:`save_rank`; ``ranks_differ`` when ranks are missing or
            the directories come from runs of different world sizes.
    """
    from torchlens.io import load

    root = Path(root)
    dirs = sorted(
        (int(m.group(1)), p)
        for p in (root.iterdir() if root.is_dir() else ())
        if p.is_dir() and (m := _RANK_DIR.fullmatch(p.name))
    )
    if not dirs:
        raise DistributedError(
            f"{str(root)!r} holds no rank directory (rank0, rank1, ...); save each rank's "
            "trace with tl.distributed.save_rank(trace, root) under torchrun",
            code="not_a_rank",
        )
    traces = []
    for rank, path in dirs:
        trace = load(path)
        info = trace.meta.get(RANK_META)
        if not isinstance(info, dict) or info.get("rank") != rank:
            raise DistributedError(
                f"{str(path)!r} was not saved by tl.distributed.save_rank for rank {rank}; "
                "save each rank's trace with save_rank",
                code="not_a_rank",
            )
        traces.append(trace)
    worlds = {t.meta[RANK_META]["world_size"] for t in traces}
    ranks = [rank for rank, _ in dirs]
    if len(worlds) != 1 or ranks != list(range(next(iter(worlds)))):
        raise DistributedError(
            f"{str(root)!r} holds ranks {ranks} saved with world sizes {sorted(worlds)}; "
            "every rank of one run saves under the same root: save them again",
            code="ranks_differ",
        )
    return RankTraces(tuple(traces))


@dataclass(frozen=True)
class RankOp:
    """One op across ranks: ``records[r]`` is rank ``r``'s record of it (None where that
    rank has no op of this label), ``placements[r]`` the layout of its value there (None
    for a plain tensor)."""

    label: str
    records: tuple[Op | None, ...]
    placements: tuple[dict[str, Any] | None, ...]

    def global_value(self) -> torch.Tensor:
        """The value as one tensor: a ``DTensor`` reassembled from every rank's shard, a
        plain tensor that every rank holds alike as it is.

        Raises:
            DistributedError: ``ranks_differ`` when a rank lacks the op, or plain values
                differ between ranks (data parallel: each rank has its own; read
                ``records[r].out``).
        """
        missing = [r for r, op in enumerate(self.records) if op is None]
        if missing:
            raise DistributedError(
                f"ranks {missing} have no op {self.label!r}: their forwards differ "
                "(compare them with RankTraces.diff)",
                code="ranks_differ",
            )
        values = [op.out for op in self.records]  # type: ignore[union-attr]
        if all(p is not None for p in self.placements):
            return assemble(list(zip(self.placements, values)))  # type: ignore[arg-type]
        if all(torch.equal(values[0], v) for v in values[1:]):
            return values[0]
        raise DistributedError(
            f"{self.label!r} is not a DTensor and the ranks hold different values of it "
            "(data parallel: each rank computes on its own inputs); read each rank's value "
            "as RankTraces[label].records[rank].out",
            code="ranks_differ",
        )


class RankTraces:
    """The traces of every rank of one run (:func:`load_ranks`), as one object.

    Iterating gives the op labels of rank 0 in execution order; indexing by label gives a
    :class:`RankOp`; :meth:`global_value` reassembles a sharded value; :meth:`diff` compares
    two ranks with ``tl.diff``.
    """

    def __init__(self, traces: tuple[Trace, ...]) -> None:
        self.traces = traces
        self._placements = [t.meta[RANK_META].get("placements", {}) for t in traces]

    @property
    def world_size(self) -> int:
        """How many ranks saved a trace."""
        return len(self.traces)

    def __len__(self) -> int:
        return len(self.traces[0].ops)

    def __iter__(self) -> Iterator[str]:
        return (op.label for op in self.traces[0].ops)

    def __getitem__(self, label: str) -> RankOp:
        records = []
        for trace in self.traces:
            try:
                record = trace[label]
            except (KeyError, LookupError):
                record = None
            records.append(record)
        if all(r is None for r in records):
            raise DistributedError(
                f"no rank has an op or source {label!r}; the labels are those of tl.trace",
                code="ranks_differ",
            )
        placements = tuple(p.get(label) for p in self._placements)
        return RankOp(label, tuple(records), placements)

    def global_value(self, label: str) -> torch.Tensor:
        """``self[label].global_value()``: the value of ``label`` as one tensor."""
        return self[label].global_value()

    def diff(self, a: int = 0, b: int = 1, **kwargs: Any) -> Any:
        """``tl.diff`` of rank ``a``'s trace against rank ``b``'s (keyword arguments as
        ``tl.diff``); its ``first_divergence`` is the first op where the ranks part ways."""
        from torchlens.debug import diff

        return diff(self.traces[a], self.traces[b], **kwargs)

    def __repr__(self) -> str:
        return f"RankTraces({self.world_size} ranks, {len(self)} ops on rank 0)"
