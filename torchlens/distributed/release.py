"""A trace outlives the process group of the run it recorded.

What a sharded forward returns carries the run with it: FSDP2 registers its pre-backward
hook on each output tensor and its post-backward function in the autograd graph, and both
hold the FSDP state, its parameter groups and their ``ProcessGroup``. A trace keeping those
tensors keeps the process group alive past ``dist.destroy_process_group()``, so the gloo
worker threads are still running when Python finalizes; a worker that then drops the last
reference to a finished collective needs the GIL to free its tensors, is stopped by the
finalizing interpreter in the middle of a destructor, and the process aborts
("terminate called without an active exception").

:func:`release_run` makes a trace captured without ``save_grads`` hold plain tensors only:
its saved values and ``trace.output`` detached (same storage, no graph, no hooks). Such a
trace promises no live autograd graph (``Trace.backward`` needs ``save_grads=True``), so
nothing is lost. A ``DTensor`` value keeps its local shard and placement, on a copy of its
device mesh that names its process groups (``_dim_group_names``) without holding them
(the mesh's ``_pg_registry``): an equal mesh (``DeviceMesh.__eq__`` compares layouts), so
replay computes with it as before, resolving each group by name while it exists. It runs
only under an initialized process group, where this matters.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from torchlens._tensors import version_of
from torchlens.capture import RELEASES, Rewrap, fill, flatten
from torchlens.distributed.placements import _is_dtensor
from torchlens.errors import DistributedError
from torchlens.replay import RESTORES

__all__ = ["release_run", "register_release", "GroupRef", "restore_groups"]


@dataclasses.dataclass(frozen=True)
class GroupRef:
    """A collective's process group as a recorded op keeps it: its name and global ranks
    (plain data), resolved to the live group when the op is rerun (:func:`restore_groups`)."""

    name: str
    ranks: tuple[int, ...]

    def resolve(self) -> Any:
        """The live ``ProcessGroup`` of this name.

        Raises:
            DistributedError: ``no_process_group`` when no group of this name exists (it
                was destroyed: replay a trace while its process group is up).
        """
        from torch.distributed.distributed_c10d import _resolve_process_group

        try:
            return _resolve_process_group(self.name)
        except Exception as err:  # noqa: BLE001 - destroyed, or another run's
            raise DistributedError(
                f"the process group {self.name!r} (ranks {list(self.ranks)}) of this "
                "collective is gone: replay a trace on every rank while the process group "
                "of its run is up (before dist.destroy_process_group())",
                code="no_process_group",
            ) from err


def _as_ref(value: Any) -> Any:
    """A ``ProcessGroup`` as a :class:`GroupRef`; anything else as it is."""
    import torch.distributed as dist

    if isinstance(value, dist.ProcessGroup):
        return GroupRef(value.group_name, tuple(dist.get_process_group_ranks(value)))
    return value


def _live(value: Any) -> Any:
    return value.resolve() if type(value) is GroupRef else value


def restore_groups(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """``args`` and ``kwargs`` with each :class:`GroupRef` resolved to its live group."""
    return tuple(_live(a) for a in args), {k: _live(v) for k, v in kwargs.items()}


def _unbound_mesh(mesh: Any, done: dict[int, Any]) -> Any:
    """A copy of ``mesh`` equal to it that holds no ``ProcessGroup`` (nor do the meshes it
    refers to); ``done`` maps the meshes copied so far to their copies."""
    copy = done.get(id(mesh))
    if copy is None:
        copy = done[id(mesh)] = object.__new__(type(mesh))
        state = dict(mesh.__dict__)
        state["_pg_registry"] = {}
        if state.get("_root_mesh") is not None:
            state["_root_mesh"] = _unbound_mesh(state["_root_mesh"], done)
        if state.get("_flatten_mapping"):
            state["_flatten_mapping"] = {
                k: _unbound_mesh(m, done) for k, m in state["_flatten_mapping"].items()
            }
        copy.__dict__.update(state)
    return copy


def _plain(value: Any, meshes: dict[int, Any]) -> Any:
    """``value`` without autograd graph, hooks or process group (see the module's doc)."""
    if not isinstance(value, torch.Tensor):
        return value
    if _is_dtensor(value):
        spec = value._spec
        if getattr(spec.mesh, "_pg_registry", None) or value.requires_grad:
            unbound = object.__new__(type(spec))  # a copy on the unbound mesh (no checks
            unbound.__dict__.update(spec.__dict__)  # rerun: the spec is valid as it is)
            unbound.__dict__["mesh"] = _unbound_mesh(spec.mesh, meshes)
            return type(value)(value._local_tensor.detach(), unbound, requires_grad=False)
        return value
    return value.detach() if value.requires_grad else value


def release_run(trace: Any) -> None:
    """Make the values ``trace`` keeps (and its output) hold no autograd graph, hook or
    process group, when ``torch.distributed`` is initialized; else nothing."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    meshes: dict[int, Any] = {}
    values = getattr(trace.store, "values", None)
    if isinstance(values, dict):
        versions = trace.store.versions
        for label, value in values.items():
            plain = values[label] = _plain(value, meshes)
            if plain is not value and type(plain) is not torch.Tensor and label in versions:
                versions[label] = version_of(plain)  # a new wrapper: its own counter
    for op in trace.ops:
        if isinstance(op.func, Rewrap):  # what a wrap op rewraps into (capture/wrappers.py)
            op.func.like = _plain(op.func.like, meshes)
        elif _restored(op.func):  # a collective: its group by name and ranks
            op.args_template = tuple(_as_ref(a) for a in op.args_template)
            op.kwargs_template = {k: _as_ref(v) for k, v in op.kwargs_template.items()}
    leaves, template = flatten(trace.output)
    plain = [_plain(tensor, meshes) for _, tensor in leaves]
    if any(new is not old for new, (_, old) in zip(plain, leaves)):
        trace.output = fill(template, plain)


def _restored(func: Any) -> bool:
    try:
        return func in RESTORES
    except TypeError:  # unhashable
        return False


def register_release() -> None:
    """Have capture call :func:`release_run` on each trace it finishes (idempotent)."""
    if release_run not in RELEASES:
        RELEASES.append(release_run)
