"""Find tensors inside nested arguments and outputs, and put values back in their place.

A *template* is the structure with each tensor replaced by an :class:`ArgSlot`; filling it
with other tensors rebuilds the structure. Lists, tuples, namedtuples, dicts (including
``OrderedDict`` subclasses such as Hugging Face's ``ModelOutput``) and dataclasses are walked.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = [
    "ATOMS", "ArgSlot", "TemplateDataclass", "flatten", "flatten_call", "fill", "is_atom",
    "plain_slice", "slots_in_order",
]  # fmt: skip

Tensor = torch.Tensor
Parameter = torch.nn.Parameter
_POSITIONS = tuple(str(i) for i in range(16))  # argument paths of the first positions


class ArgSlot:
    """Placeholder for the ``index``-th tensor of a flattened structure."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"ArgSlot({self.index})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ArgSlot) and other.index == self.index

    def __hash__(self) -> int:
        return hash(("ArgSlot", self.index))


_SLOTS = tuple(ArgSlot(i) for i in range(16))  # shared: a slot is never changed


def _slot(index: int) -> ArgSlot:
    return _SLOTS[index] if index < 16 else ArgSlot(index)


def slots_in_order(args: Any, kwargs: Any, n: int) -> bool:
    """Whether a call's templates are the usual flat call: the first ``n`` positional items
    are ``ArgSlot(0) .. ArgSlot(n - 1)``, in order, and every other item is an atom or a
    tuple of atoms (a size, an index: immutable, so it can be passed as it is). Such a
    call is ``func(*tensors, *args[n:], **kwargs)``: no filling, no walk. False says only
    that the templates are not that simple.

    Example:
        >>> slots_in_order((ArgSlot(0), ArgSlot(1), 2.0), {"dim": -1}, 2)
        True
        >>> slots_in_order((ArgSlot(1), ArgSlot(0)), {}, 2)
        False
    """
    if type(args) is not tuple or type(kwargs) is not dict:
        return False
    i = 0
    for item in args:
        if i < n:
            if type(item) is not ArgSlot or item.index != i:
                return False
            i += 1
        elif not is_atom(item) and not _atoms_tuple(item):
            return False
    return i == n and all(is_atom(item) or _atoms_tuple(item) for item in kwargs.values())


def _atoms_tuple(item: Any) -> bool:
    """A tuple of atoms (a size, an index of slices): a constant argument, like an atom."""
    return type(item) is tuple and all(map(is_atom, item))


def flatten(obj: Any, prefix: str = "") -> tuple[list[tuple[str, Tensor]], Any]:
    """Tensors in ``obj`` with their paths, and ``obj``'s template.

    Example:
        >>> leaves, template = flatten((torch.ones(1), {"a": torch.zeros(1)}))
        >>> [path for path, _ in leaves], template
        (['0', '1.a'], (ArgSlot(0), {'a': ArgSlot(1)}))
    """
    leaves: list[tuple[str, Tensor]] = []
    template = _walk(obj, prefix, leaves)
    return leaves, template


def flatten_call(args: tuple, kwargs: dict) -> tuple[list[tuple[str, Tensor]], tuple, dict]:
    """Tensors in a call's arguments with their positions, and both templates."""
    leaves: list[tuple[str, Tensor]] = []
    template: list[Any] = []
    for i, arg in enumerate(args):  # the common flat case inline; anything nested is walked
        kind = type(arg)
        if kind in ATOMS or kind is slice and plain_slice(arg):
            template.append(arg)
        elif kind is Tensor or kind is Parameter:
            template.append(_slot(len(leaves)))
            leaves.append((_POSITIONS[i] if i < len(_POSITIONS) else str(i), arg))
        else:
            template.append(_walk(arg, str(i), leaves))
    if not kwargs:
        return leaves, tuple(template), {}
    for value in kwargs.values():
        if type(value) not in ATOMS:
            break
    else:  # flags such as inplace=False: nothing to walk
        return leaves, tuple(template), dict(kwargs)
    kwargs_template = {key: _walk(value, key, leaves) for key, value in kwargs.items()}
    return leaves, tuple(template), kwargs_template


# Argument types that never hold a tensor: returned as they are, without a walk (the
# common case of every call's ints, dtypes and sizes, so it is checked first). A slice is
# one when its bounds are (plain_slice): ``x[:, a:b]`` may take 0-d tensors as bounds.
ATOMS = frozenset({
    int, float, bool, complex, str, type(None), type(Ellipsis),
    torch.dtype, torch.device, torch.Size, torch.memory_format, torch.layout,
})  # fmt: skip
_BOUNDS = frozenset({int, type(None)})


def plain_slice(obj: slice) -> bool:
    """Whether a slice's bounds are ints or None (no tensor, nothing to walk)."""
    return type(obj.start) in _BOUNDS and type(obj.stop) in _BOUNDS and type(obj.step) in _BOUNDS


def is_atom(obj: Any) -> bool:
    """Whether ``obj`` holds no tensor by its type alone (see :data:`ATOMS`)."""
    kind = type(obj)
    return kind in ATOMS or kind is slice and plain_slice(obj)


def _walk(obj: Any, path: str, leaves: list[tuple[str, Tensor]]) -> Any:
    kind = type(obj)
    if kind in ATOMS:
        return obj
    if kind is slice:  # its bounds walked: a tensor bound is an argument like any other
        if plain_slice(obj):
            return obj
        start = _walk(obj.start, _join(path, "start"), leaves)
        stop = _walk(obj.stop, _join(path, "stop"), leaves)
        return slice(start, stop, _walk(obj.step, _join(path, "step"), leaves))
    if isinstance(obj, Tensor):
        leaves.append((path, obj))
        return _slot(len(leaves) - 1)
    if kind is tuple or kind is list:
        for item in obj:
            if type(item) not in ATOMS and not (type(item) is slice and plain_slice(item)):
                break
        else:  # sizes, dims, flags: nothing to walk (a list is copied, tuples are immutable)
            return obj if kind is tuple else list(obj)
        items = [_walk(item, _join(path, i), leaves) for i, item in enumerate(obj)]
        return tuple(items) if kind is tuple else items
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple, return_types
        items = [_walk(item, _join(path, i), leaves) for i, item in enumerate(obj)]
        return _rebuild_namedtuple(kind, items)
    if isinstance(obj, (list, tuple)):
        items = [_walk(item, _join(path, i), leaves) for i, item in enumerate(obj)]
        return _rebuild_sequence(kind, items)
    if isinstance(obj, dict):
        walked = {key: _walk(value, _join(path, key), leaves) for key, value in obj.items()}
        return _rebuild_mapping(obj, walked)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        walked = {
            f.name: _walk(getattr(obj, f.name), _join(path, f.name), leaves)
            for f in dataclasses.fields(obj)
        }
        return TemplateDataclass(kind, walked)
    return obj


def fill(template: Any, values: Sequence[Any]) -> Any:
    """Rebuild a structure from its template, slot ``i`` taking ``values[i]``."""
    kind = type(template)
    if kind is ArgSlot:
        return values[template.index]
    if kind in ATOMS:
        return template
    if kind is slice:
        if plain_slice(template):
            return template
        start, stop = fill(template.start, values), fill(template.stop, values)
        return slice(start, stop, fill(template.step, values))
    if kind is tuple:
        return tuple([fill(item, values) for item in template])
    if kind is list:
        return [fill(item, values) for item in template]
    if kind is TemplateDataclass:
        return template.build(lambda t: fill(t, values))
    if isinstance(template, tuple) and hasattr(template, "_fields"):
        return kind(*(fill(item, values) for item in template))
    if isinstance(template, (list, tuple)):
        return _rebuild_sequence(kind, [fill(item, values) for item in template])
    if isinstance(template, dict):
        return _rebuild_mapping(template, {k: fill(v, values) for k, v in template.items()})
    return template


class TemplateDataclass:
    """A dataclass instance waiting for its fields (dataclasses may forbid placeholders);
    io rebuilds saved dataclass outputs as these too."""

    __slots__ = ("cls", "fields")

    def __init__(self, cls: type, fields: dict[str, Any]) -> None:
        self.cls = cls
        self.fields = fields

    def build(self, fill_one: Callable[[Any], Any]) -> Any:
        values = {name: fill_one(value) for name, value in self.fields.items()}
        init = {f.name: values[f.name] for f in dataclasses.fields(self.cls) if f.init}
        obj = self.cls(**init)
        for name, value in values.items():
            if name not in init:
                object.__setattr__(obj, name, value)
        return obj


def _rebuild_namedtuple(kind: type, items: list[Any]) -> Any:
    try:
        return kind(*items)
    except (TypeError, AttributeError, ValueError):  # a __new__ that inspects its fields
        return tuple.__new__(kind, items)  # (PackedSequence reads batch_sizes.device)


def _rebuild_sequence(kind: type, items: list[Any]) -> Any:
    try:
        return kind(items)
    except TypeError:
        return tuple(items)


def _rebuild_mapping(original: dict, walked: dict) -> Any:
    kind = type(original)
    if kind is dict:
        return walked
    try:
        return kind(walked)
    except TypeError:  # e.g. dataclass-based ModelOutput subclasses with required fields
        obj = kind.__new__(kind)
        # an OrderedDict keeps its own order, which dict's methods would bypass
        setitem = OrderedDict.__setitem__ if isinstance(obj, OrderedDict) else dict.__setitem__
        attributes = getattr(obj, "__dict__", None)
        for key, value in walked.items():
            setitem(obj, key, value)
            if attributes is not None and isinstance(key, str):
                attributes[key] = value  # a dataclass's fields are attributes too
        return obj


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)
