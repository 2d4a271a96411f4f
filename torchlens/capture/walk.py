"""A model's submodules with their addresses, walked once per capture.

``nn.Module.named_modules`` is a recursive generator: on a model of a few hundred modules it
costs several microseconds per module, paid on every trace. The walk here visits the same
modules in the same order (depth first, each module once, at its first address).
"""

from __future__ import annotations

from torch import Tensor, nn

from torchlens.errors import InvalidArgumentError

__all__ = ["every_address", "named_modules", "named_tensors", "owned_tensors"]

_TORCH_WALK = nn.Module.named_modules
_TORCH_MEMBERS = {
    "_parameters": nn.Module.named_parameters,
    "_buffers": nn.Module.named_buffers,
}
_MAX_DEPTH = 1000  # deeper is a module holding itself: torch's own walk raises then


def named_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``list(model.named_modules())``, without the recursive generators.

    A module class with a ``named_modules`` of its own is asked itself (the whole walk is
    then torch's), so an override keeps its meaning.

    Example:
        >>> shared = nn.Linear(2, 2)
        >>> [address for address, _ in named_modules(nn.Sequential(shared, nn.ReLU(), shared))]
        ['', '0', '1']
    """
    return _walk(model, unique=True)


def owned_tensors(modules: list[tuple[str, nn.Module]]) -> dict[int, tuple[str, str, Tensor]]:
    """``id(tensor) -> (kind, address, tensor)`` for the parameters and buffers of
    ``modules`` (a :func:`named_modules` walk): kind ``"parameter"`` or ``"buffer"``, the
    address ``named_parameters``/``named_buffers`` give, a shared tensor under its first.

    Example:
        >>> lin = nn.Linear(2, 2)
        >>> [entry[:2] for entry in owned_tensors(named_modules(nn.Sequential(lin, lin))).values()]
        [('parameter', '0.weight'), ('parameter', '0.bias')]
    """
    owned: dict[int, tuple[str, str, Tensor]] = {}
    for prefix, module in modules:
        parameters, buffers = module._parameters, module._buffers
        if not parameters and not buffers:  # most modules of a deep model hold neither
            continue
        dot = prefix + "." if prefix else ""
        for kind, tensors in (("parameter", parameters), ("buffer", buffers)):
            for name, tensor in tensors.items():
                if tensor is not None and id(tensor) not in owned:
                    owned[id(tensor)] = (kind, dot + name, tensor)
    return owned


def every_address(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``list(model.named_modules(remove_duplicate=False))``, without the recursive
    generators: a module held at two addresses comes at both, depth first.

    Example:
        >>> shared = nn.Linear(2, 2)
        >>> [address for address, _ in every_address(nn.Sequential(shared, shared))]
        ['', '0', '1']
    """
    return _walk(model, unique=False)


def _walk(model: nn.Module, unique: bool) -> list[tuple[str, nn.Module]]:
    """Depth first from ``model``: each module once, at its first address (``unique``), or
    at every address; torch's own walk where a class has a ``named_modules`` of its own, or
    where the tree holds a module inside itself (torch's walk raises on that)."""
    found: list[tuple[str, nn.Module]] = []
    seen: set[int] = set()
    stack: list[tuple[str, nn.Module, int]] = [("", model, 0)]
    pop, push = stack.pop, stack.append  # (bound once: this loop runs per module per trace)
    while stack:
        prefix, module, depth = pop()
        if unique:
            if id(module) in seen:
                continue
            seen.add(id(module))
        if type(module).named_modules is not _TORCH_WALK or depth > _MAX_DEPTH:
            return list(model.named_modules(remove_duplicate=unique))
        found.append((prefix, module))
        children = module._modules
        if children:
            dot = prefix + "." if prefix else ""
            for name, child in reversed(children.items()):
                if child is not None:
                    push((dot + name, child, depth + 1))
    return found


def named_tensors(model: nn.Module, members: str, walk: list | None = None) -> dict[str, Tensor]:
    """``dict(model.named_parameters(remove_duplicate=False))`` for ``members`` of
    ``"_parameters"``, and of ``named_buffers`` for ``"_buffers"``, from the
    :func:`every_address` ``walk`` (made here when not given). A model overriding the
    method is asked itself.

    Raises:
        InvalidArgumentError: ``bad_members`` for ``members`` other than those two.

    Example:
        >>> list(named_tensors(nn.Sequential(nn.Linear(2, 2)), "_parameters"))
        ['0.weight', '0.bias']
    """
    method = _TORCH_MEMBERS.get(members)
    if method is None:
        raise InvalidArgumentError(
            f"members must be one of {sorted(_TORCH_MEMBERS)}, got {members!r}: "
            "'_parameters' names parameters, '_buffers' buffers",
            code="bad_members",
        )
    if getattr(type(model), method.__name__) is not method:
        return dict(getattr(model, method.__name__)(remove_duplicate=False))
    found: dict[str, Tensor] = {}
    for prefix, module in every_address(model) if walk is None else walk:
        tensors = getattr(module, members)
        if tensors:
            dot = prefix + "." if prefix else ""
            for name, tensor in tensors.items():
                if tensor is not None:
                    found[dot + name] = tensor
    return found
