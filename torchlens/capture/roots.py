"""What a capture is rooted at, and the address of every module that runs in it.

Every capture has a *root* (``DESIGN.md``, "Roots, module calls and escapes"):

* the traced module itself, whose own call is the capture;
* the owner of a traced bound method (``tl.trace(model.generate, ...)`` -> ``model``, also
  through ``functools.partial``): its submodules are addressed as ``model(...)`` would
  address them, and each call of the owner itself (``generate`` calling ``self(...)`` once
  per decoding step) is a module call at the address ``""``;
* for any callable, the modules named with ``root=``: one module (as an owner), or a dict
  ``{"unet": unet, "vae": vae}`` whose names prefix the addresses (``unet.down_blocks.0``).

A module the root does not reach (a plain function without ``root=``, a module built
during the forward) still is recorded, at a fallback address: its class name
(``UNet2DConditionModel``; ``UNet2DConditionModel_2``, ``_3`` for further instances of one
class, numbered in the order of their first call), and its submodules below it
(``UNet2DConditionModel.down_blocks.0``).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from torchlens.capture.walk import named_modules
from torchlens.errors import InvalidArgumentError

__all__ = ["Root", "ModuleNames", "resolve_root", "method_owner"]

_WILD = frozenset("*?[]:")


@dataclass
class Root:
    """The modules a capture knows before its forward runs.

    Attributes:
        modules: ``(address, module)`` for each of them, each module once, depth first.
        itself: the traced module, whose own call is the capture (``None`` for any other
            callable); every other module of ``modules``, an owner at ``""`` included, has
            its calls recorded.
        type_name: what the trace's root call is named (``"LlamaForCausalLM.generate"``).
        fallbacks: the fallback addresses given during the forward (modules the root does
            not reach), in order.
    """

    modules: list[tuple[str, nn.Module]]
    itself: nn.Module | None
    type_name: str
    fallbacks: list[str] = field(default_factory=list)


def method_owner(model: Any) -> nn.Module | None:
    """The module a bound method belongs to (``model.generate`` -> ``model``), looked for
    through ``functools.partial``; ``None`` for anything else.

    Example:
        >>> lin = nn.Linear(2, 2)
        >>> method_owner(functools.partial(lin.extra_repr)) is lin
        True
    """
    while isinstance(model, functools.partial):
        model = model.func
    owner = getattr(model, "__self__", None) if inspect.ismethod(model) else None
    return owner if isinstance(owner, nn.Module) else None


def resolve_root(model: Any, root: Any = None) -> Root:
    """The :class:`Root` of a capture of ``model`` (see the module docstring).

    Raises:
        InvalidArgumentError: ``bad_root`` for a ``root=`` that is neither a module nor a
            dict of named modules, or given with a traced module other than itself.

    Example:
        >>> enc, dec = nn.Linear(2, 2), nn.Linear(2, 2)
        >>> [a for a, _ in resolve_root(lambda x: dec(enc(x)), {"enc": enc, "dec": dec}).modules]
        ['enc', 'dec']
    """
    if isinstance(model, nn.Module):
        if root is not None and root is not model:
            raise InvalidArgumentError(
                "root= names the modules of a traced function or method; a traced module "
                f"is its own root, so drop root= (got a {type(root).__name__})",
                code="bad_root",
            )
        return Root(named_modules(model), model, type(model).__name__)
    name = getattr(model, "__qualname__", None) or type(model).__name__
    if root is None:
        owner = method_owner(model)
        if owner is None:
            return Root([], None, name)
        method = getattr(model, "__name__", None) or name.rpartition(".")[2]
        return Root(named_modules(owner), None, f"{type(owner).__name__}.{method}")
    if isinstance(root, nn.Module):
        return Root(named_modules(root), None, name)
    if not isinstance(root, Mapping) or not root:
        raise InvalidArgumentError(
            "root= takes a module, or a dict {name: module} naming the modules the traced "
            f"function calls, got {type(root).__name__}",
            code="bad_root",
        )
    walk: list[tuple[str, nn.Module]] = []
    seen: set[int] = set()
    for key, module in root.items():
        if not isinstance(key, str) or not key or _WILD.intersection(key) or "." in key:
            raise InvalidArgumentError(
                f"root= names must be plain names such as 'unet' (no dots, ':' or "
                f"wildcards), got {key!r}",
                code="bad_root",
            )
        if not isinstance(module, nn.Module):
            raise InvalidArgumentError(
                f"root={{{key!r}: ...}} must be an nn.Module, got {type(module).__name__}",
                code="bad_root",
            )
        for address, sub in named_modules(module):
            if id(sub) not in seen:
                seen.add(id(sub))
                walk.append((f"{key}.{address}" if address else key, sub))
    return Root(walk, None, name)


class ModuleNames:
    """The address of each module of a capture: the root's, then fallbacks for others.

    Args:
        root: the capture's :class:`Root`.
    """

    def __init__(self, root: Root) -> None:
        self._root = root
        # made at the first call of a module not walked before the forward, if any: a
        # capture of a module and its tree alone never pays for them
        self._by_id: dict[int, str] = {}
        self._taken: set[str] = set()

    def name(self, module: nn.Module) -> tuple[str, list[tuple[str, nn.Module]]]:
        """``module``'s address, and the modules named by this call (``module`` and its
        submodules, ``(address, module)``; none when it had an address already).

        A module the root reaches now but did not before the forward (built during it)
        gets its address below the root; any other the fallback of the module docstring.
        """
        if not self._by_id:
            self._by_id = {id(m): address for address, m in self._root.modules}
            self._taken = set(self._by_id.values())
        address = self._by_id.get(id(module))
        if address is not None:
            return address, []
        for prefix, top in self._tops():
            for sub_address, sub in named_modules(top):
                if sub is module:
                    return self._add(_join(prefix, sub_address), module)
        base = type(module).__name__
        address, k = base, 1
        while address in self._taken:
            k += 1
            address = f"{base}_{k}"
        self._root.fallbacks.append(address)
        return self._add(address, module)

    def _tops(self) -> list[tuple[str, nn.Module]]:
        """The modules whose walks the root is made of (the root itself, or each named)."""
        walk = self._root.modules
        if walk and walk[0][0] == "":
            return walk[:1]
        return [(a, m) for a, m in walk if "." not in a]

    def _add(self, address: str, module: nn.Module) -> tuple[str, list[tuple[str, nn.Module]]]:
        new = []
        for sub_address, sub in named_modules(module):
            if id(sub) not in self._by_id:
                full = _join(address, sub_address)
                self._by_id[id(sub)] = full
                self._taken.add(full)
                new.append((full, sub))
        return address, new


def _join(prefix: str, address: str) -> str:
    return f"{prefix}.{address}" if prefix and address else prefix or address
