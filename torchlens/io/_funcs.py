"""Name the torch function an op called, and find it again by name, without running code.

A saved op records its function as ``{"ns": namespace, "name": attribute}``. Loading looks the
namespace up in the fixed table below and reads one attribute with ``getattr``; nothing is
imported and nothing named by the file is called. The object found must also *be* a torch
operator (a generated ATen binding, a ``Tensor`` method or property, or a function of
``torch.nn.functional`` / ``torch.functional``), so a hostile file cannot point replay at
``torch.load``, ``torch.save`` or ``torch.manual_seed``.
"""

from __future__ import annotations

import contextlib
import re
import types
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["func_ref", "resolve_func", "UnresolvableFunc"]

# Namespaces a saved function may live in, in the order they are searched when saving.
_NAMESPACES: dict[str, Any] = {
    "torch.nn.functional": torch.nn.functional,
    "torch._C._nn": torch._C._nn,
    "torch._C._fft": torch._C._fft,
    "torch._C._linalg": torch._C._linalg,
    "torch._C._special": torch._C._special,
    "torch": torch,
    "torch.Tensor": torch.Tensor,
    "torch.functional": torch.functional,
    "torch._C._VariableFunctions": torch._C._VariableFunctions,
    "torch.linalg": torch.linalg,
    "torch.fft": torch.fft,
    "torch.special": torch.special,
    "torch.autograd": torch.autograd,  # grad, backward only (_AUTOGRAD): in the forward
}
_OP_MODULES = (torch._C._nn, torch._C._fft, torch._C._linalg, torch._C._special)
_PY_MODULES = frozenset({"torch.nn.functional", "torch.functional", "torch._tensor"})
_DENIED = frozenset({"from_file", "save", "load"})  # file access: never replayed from a file
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_GETTER = "getter"  # a Tensor property read such as x.T, recorded as its __get__
_SETTER = "setter"  # x.data = value, recorded as Tensor.data's __set__ (the only one)
_SETTABLE = frozenset({"data"})
# of torch.autograd: replay re-makes them (grad_replay.py)
_AUTOGRAD = frozenset({"grad", "backward"})


class UnresolvableFunc(ValueError):
    """A function cannot be named on save or found on load; the message says why."""


_REFS: dict[Any, dict[str, str]] = {}


def func_ref(func: Callable[..., Any]) -> dict[str, str]:
    """The JSON reference of ``func``: ``{"ns": ..., "name": ...}`` (plus ``"kind"``).

    Raises:
        UnresolvableFunc: when ``func`` is not a torch operator reachable by name.

    Example:
        >>> func_ref(torch.nn.functional.relu)
        {'name': 'relu', 'ns': 'torch.nn.functional'}
    """
    with contextlib.suppress(KeyError, TypeError):
        return dict(_REFS[func])
    ref = _find_ref(func)
    with contextlib.suppress(TypeError):  # unhashable callables are looked up afresh
        _REFS[func] = ref
    return dict(ref)


def _find_ref(func: Callable[..., Any]) -> dict[str, str]:
    prop = _property_name(func)
    if prop is not None:
        return {"kind": _GETTER, "name": prop, "ns": "torch.Tensor"}
    prop = _property_name(func, "__set__")
    if prop in _SETTABLE:
        return {"kind": _SETTER, "name": prop, "ns": "torch.Tensor"}
    name = getattr(func, "__name__", None)
    for ns_name, ns in _NAMESPACES.items():
        if isinstance(name, str) and getattr(ns, name, None) is func:
            return _checked({"name": name, "ns": ns_name}, func)
    for ns_name, ns in _NAMESPACES.items():  # aliases such as Tensor.__pow__ for pow
        for attr in sorted(vars(ns) if isinstance(ns, type) else dir(ns)):
            if getattr(ns, attr, None) is func:
                return _checked({"name": attr, "ns": ns_name}, func)
    raise UnresolvableFunc(f"{_describe(func)} is not reachable from a torch namespace")


def resolve_func(ref: Any) -> Callable[..., Any]:
    """The callable a :func:`func_ref` names, checked to be a torch operator.

    Raises:
        UnresolvableFunc: for unknown namespaces, odd names or non-operator objects.
    """
    if not isinstance(ref, dict) or set(ref) - {"kind", "name", "ns"}:
        raise UnresolvableFunc(f"malformed function reference {ref!r}")
    ns_name, name, kind = ref.get("ns"), ref.get("name"), ref.get("kind")
    ns = _NAMESPACES.get(ns_name) if isinstance(ns_name, str) else None
    if ns is None or not isinstance(name, str) or not _IDENTIFIER.match(name):
        raise UnresolvableFunc(f"function reference {ref!r} is outside the allow-list")
    if name in _DENIED:
        raise UnresolvableFunc(f"{ns_name}.{name} is never replayed from a file")
    if kind == _GETTER:
        descriptor = vars(torch._C.TensorBase).get(name)
        if type(descriptor).__name__ != "getset_descriptor":
            raise UnresolvableFunc(f"Tensor.{name} is not a tensor property")
        return descriptor.__get__
    if kind == _SETTER and name in _SETTABLE:
        return vars(torch._C.TensorBase)[name].__set__
    if kind is not None:
        raise UnresolvableFunc(f"unknown function kind {kind!r}")
    func = getattr(ns, name, None)
    if func is None or not _is_operator(func):
        raise UnresolvableFunc(f"{ns_name}.{name} is not a torch operator")
    return func


def _checked(ref: dict[str, str], func: Callable[..., Any]) -> dict[str, str]:
    resolve_func(ref)  # what save writes, load must accept
    return ref


def _property_name(func: Any, method: str = "__get__") -> str | None:
    owner = getattr(func, "__self__", None)
    if getattr(func, "__name__", None) != method or owner is None:
        return None
    if getattr(owner, "__objclass__", None) is not torch._C.TensorBase:
        return None
    name = getattr(owner, "__name__", None)
    return name if vars(torch._C.TensorBase).get(name) is owner else None


def _is_operator(func: Any) -> bool:
    if isinstance(func, types.BuiltinFunctionType):
        owner = func.__self__
        if owner is None:
            return func.__qualname__.startswith("_VariableFunctionsClass.")
        return any(owner is module for module in _OP_MODULES)
    if type(func).__name__ in ("method_descriptor", "wrapper_descriptor"):
        return getattr(func, "__objclass__", None) is torch._C.TensorBase
    if isinstance(func, types.FunctionType):
        if func.__module__ == "torch.autograd" and func.__name__ in _AUTOGRAD:
            return func is getattr(torch.autograd, func.__name__)
        return func.__module__ in _PY_MODULES
    return False


def _describe(func: Any) -> str:
    return getattr(func, "__qualname__", None) or type(func).__name__
