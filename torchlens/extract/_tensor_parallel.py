"""``tl.extract`` on a tensor-parallel model under torchrun: every rank runs every batch, and
each site is stored as its global tensor, by rank 0 alone.

Tensor-parallel ranks compute one forward together (their collectives join the halves of
each matrix product), so the batches are not split between them: each rank runs each batch
on the same inputs. A site's value on a rank is then one of:

- a ``DTensor`` (a linear's output inside a parallel module): its ``full_tensor()``;
- a plain tensor the same on every rank (a module output redistributed to ``Replicate``):
  that tensor;
- a plain local shard (the output of ``to_local()``, and what is computed from it elementwise,
  e.g. the ReLU between a colwise and a rowwise linear): the ranks' shards concatenated
  along the dimension the ``DTensor`` it was taken from is sharded on. That layout is read
  once, from a ``tl.trace`` of the first batch on every rank (``unwrap`` ops, with the
  placement of the value they unwrapped); a local value whose layout the trace does not give
  (one reshaped after ``to_local``, e.g. the heads of an attention) is refused with
  ``tensor_parallel``, naming the site: select the ``DTensor`` op before it or the module's
  output instead.

Every rank makes the same collectives in the same order (the sites in the order computed),
and only rank 0 keeps the rows (:class:`Discard` on the others), so the store is the one a
single process would write from the unsharded model.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch
from torch import nn

from torchlens.errors import ExtractionError
from torchlens.extract._distributed import _group

__all__ = ["tensor_parallel_param", "Globalize", "Discard"]


def tensor_parallel_param(world: int, model: Any) -> str | None:
    """The name of a parameter of ``model`` sharded by tensor parallel (a ``DTensor``
    parameter outside FSDP2, or on a mesh of more than one dimension) when several processes
    run it; None for any other model."""
    if world == 1 or not isinstance(model, nn.Module):
        return None
    try:
        from torch.distributed.fsdp import FSDPModule
        from torch.distributed.tensor import DTensor
    except ImportError:  # a build without them: no such model
        return None
    under_fsdp: set[int] = set()
    for module in model.modules():
        if isinstance(module, FSDPModule):
            under_fsdp.update(id(m) for m in module.modules())
    for name, module in model.named_modules():
        for pname, param in module.named_parameters(recurse=False):
            if isinstance(param, DTensor) and (
                id(module) not in under_fsdp or param.device_mesh.ndim > 1
            ):
                return f"{name}.{pname}" if name else pname
    return None


class Globalize:
    """Turns each site's value on this rank into the global tensor (see the module's doc)."""

    def __init__(self, model: Any, world: int) -> None:
        self.model, self.world = model, world
        self.layouts: dict[str, int | None] | None = None  # label -> shard dim (None: none)

    def __call__(self, view: Any, value: torch.Tensor, args: tuple, kwargs: dict) -> torch.Tensor:
        import torch.distributed as dist

        from torchlens.distributed import placement_of  # (distributed sits above extract)

        if placement_of(value) is not None:  # a DTensor
            return value.full_tensor()
        mine = value.detach().contiguous()
        group = _group()  # (for objects: gloo beside a NCCL group)
        shapes: list[Any] = [None] * self.world
        dist.all_gather_object(shapes, tuple(mine.shape), group=group)
        if len(set(shapes)) == 1:
            parts = [torch.empty_like(mine) for _ in range(self.world)]
            dist.all_gather(parts, mine)
            if all(torch.equal(parts[0], p) for p in parts[1:]):
                return mine  # the same on every rank: a replicated value
        else:  # uneven shards
            gathered: list[Any] = [None] * self.world
            dist.all_gather_object(gathered, mine.cpu(), group=group)
            parts = [p.to(mine.device) for p in gathered]
        dim = self._layout(view.label, args, kwargs)
        if dim is None:
            raise ExtractionError(
                f"site {view.label!r} is a local shard that differs between the ranks of this "
                "tensor-parallel model, and its layout is not one torchlens can tell (it is "
                "not elementwise from to_local() of a sharded DTensor: e.g. reshaped into "
                "heads); select the DTensor op it is computed from (the linear before it) or "
                "the module's output (tl.module(...).output) instead",
                code="tensor_parallel",
            )
        return torch.cat(parts, dim=dim)

    def _layout(self, label: str, args: tuple, kwargs: dict) -> int | None:
        """The dimension ``label``'s local value is sharded on, read from a trace of the
        first batch that every rank takes together (the ranks agree on asking: they saw the
        same gathered values)."""
        if self.layouts is None:
            from torchlens.capture import trace

            # with grad: under no_grad, to_local() hands out its tensor unseen (no unwrap op)
            with torch.enable_grad():
                self.layouts = _shard_dims(trace(self.model, args, kwargs))
        return self.layouts.get(label)


def _shard_dims(trace: Any) -> dict[str, int | None]:
    """Label -> the dimension along which its value is a shard of one sharded ``DTensor``:
    an ``unwrap`` of a value ``Shard(d)`` on a one-dimensional mesh, and the ops computed from
    one elementwise (their tensor arguments all of its shape)."""
    from torchlens.distributed import placement_of
    from torchlens.errors import PayloadUnavailableError

    dims: dict[str, int | None] = {}
    for op in trace.ops:
        dim = None
        if op.func_name == "unwrap" and op.parents:
            try:
                placement = placement_of(trace[op.parents[0]].out)
            except PayloadUnavailableError:
                placement = None
            how = placement["placements"] if placement else []
            if len(how) == 1 and "shard" in how[0]:
                dim = how[0]["shard"] % len(op.shape)
        else:
            inner = [p for p in op.parents if p in dims]  # ops, not weights
            found = {dims[p] for p in inner}
            if len(found) == 1 and None not in found:
                if all(tuple(trace[p].shape) == tuple(op.shape) for p in inner):
                    dim = found.pop()
        dims[op.label] = dim
    return dims


class Discard:
    """The shard writer of a rank that stores nothing (every rank but 0 under tensor
    parallel): it takes each batch's rows and drops them."""

    def __init__(self) -> None:
        self.sources: dict[str, str] = {}
        self.site_keys: dict[str, tuple] = {}
        self.writing = nullcontext

    def add(self, index: int, start: int, size: int, values: dict[str, torch.Tensor]) -> None:
        """Drop one batch's rows."""

    def flush(self) -> None:
        """Nothing held, nothing to write."""
