"""``DTensor`` values as a rank holds them: a local shard, its placement on the device mesh,
and the global shape; and the global tensor put back together from every rank's shard.

A placement is written as plain data so it can be saved with a trace: ``{"shard": dim}``,
``{"replicate": True}`` or ``{"partial": reduce_op}`` per mesh dimension, with the mesh's
shape and this rank's coordinate on it (:func:`placement_of`).
"""

from __future__ import annotations

from typing import Any

import torch

from torchlens.errors import DistributedError

__all__ = ["placement_of", "assemble"]


def _dtensor_type() -> type | None:
    if not torch.distributed.is_available():
        return None
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # an older torch
        return None
    return DTensor


def _is_dtensor(value: Any) -> bool:
    dtensor = _dtensor_type()
    return dtensor is not None and isinstance(value, dtensor)


def placement_of(value: Any) -> dict[str, Any] | None:
    """How ``value`` is laid out across ranks, if it is a ``DTensor`` (else None): the
    placements (one per mesh dimension), the mesh shape, this rank's coordinate on the mesh,
    the global shape and the shape of the local shard it holds."""
    if not _is_dtensor(value):
        return None
    mesh = value.device_mesh
    return {
        "placements": [_plain(p) for p in value.placements],
        "mesh_shape": list(mesh.shape),
        "coordinate": list(mesh.get_coordinate() or ()),
        "global_shape": list(value.shape),
        "local_shape": list(value._local_tensor.shape),
    }


def _plain(placement: Any) -> dict[str, Any]:
    if placement.is_shard():
        return {"shard": placement.dim}
    if placement.is_partial():
        return {"partial": str(getattr(placement, "reduce_op", "sum"))}
    return {"replicate": True}


_REDUCE = {
    "sum": lambda ts: torch.stack(ts).sum(0),
    "avg": lambda ts: torch.stack(ts).mean(0),
    "max": lambda ts: torch.stack(ts).amax(0),
    "min": lambda ts: torch.stack(ts).amin(0),
}


def assemble(shards: list[tuple[dict[str, Any], torch.Tensor]]) -> torch.Tensor:
    """The global tensor from every rank's ``(placement, local shard)`` (placements as
    :func:`placement_of` gives them): shards are concatenated along their sharded dimension in
    mesh order, partial values reduced, replicas taken once; the innermost mesh dimension
    first.

    Raises:
        DistributedError: ``ranks_differ`` when the ranks give different placements, mesh
            or global shape, or the shards do not make the global shape.
    """
    first = shards[0][0]
    for placement, _ in shards:
        if any(placement[k] != first[k] for k in ("placements", "mesh_shape", "global_shape")):
            raise DistributedError(
                f"the ranks hold this value with different layouts ({first} and "
                f"{placement}); a value is reassembled only from shards of one DTensor",
                code="ranks_differ",
            )
    level = {tuple(p["coordinate"]): t for p, t in shards}
    for dim in reversed(range(len(first["mesh_shape"]))):
        how = first["placements"][dim]
        groups: dict[tuple, list[tuple[int, torch.Tensor]]] = {}
        for coordinate, tensor in level.items():
            groups.setdefault(coordinate[:dim], []).append((coordinate[dim], tensor))
        level = {}
        for outer, members in groups.items():
            parts = [t for _, t in sorted(members, key=lambda m: m[0])]
            if "shard" in how:
                level[outer] = torch.cat(parts, dim=how["shard"])
            elif "partial" in how:
                reduce = _REDUCE.get(how["partial"].lower().replace("redop.", ""))
                if reduce is None:
                    raise DistributedError(
                        f"a Partial({how['partial']}) value cannot be reduced here; "
                        "redistribute it to Replicate in the model to read it whole",
                        code="ranks_differ",
                    )
                level[outer] = reduce(parts)
            else:
                level[outer] = parts[0]
    (whole,) = level.values()
    if list(whole.shape) != first["global_shape"]:
        raise DistributedError(
            f"the shards make a tensor of shape {list(whole.shape)}, not the global shape "
            f"{first['global_shape']}: a rank's trace is missing or from another run",
            code="ranks_differ",
        )
    return whole
