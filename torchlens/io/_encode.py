"""Plain Python values <-> JSON, for argument templates, output templates and ``meta``.

JSON has lists, dicts with string keys, numbers, strings, booleans and null. Everything
else a torch call takes is written as a one-key object whose key starts with ``$``
(``{"$tuple": [...]}``, ``{"$dtype": "float32"}``, ``{"$slot": 0}``), and decoded by a table
of constructors that build plain data only: no names from the file are imported or called.

Output templates (:func:`encode_output`) also take the containers models return whose
classes a file cannot name safely, and write them as look-alikes built from plain data: a
dict subclass (Hugging Face's ``ModelOutput``) as an ``OrderedDict`` or ``dict``, a
namedtuple or ``torch.return_types`` value as a fresh namedtuple of the same name and
fields, a dataclass as a fresh dataclass of the same name and fields. Other objects in an
output (a key-value cache) are written as ``{"$dropped": type name}`` and load as None.
"""

from __future__ import annotations

import dataclasses
import math
from collections import OrderedDict, namedtuple
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import torch

from torchlens.capture import ArgSlot, TemplateDataclass

__all__ = ["encode", "encode_output", "decode", "Unencodable"]


class Unencodable(ValueError):
    """A value has no JSON form (or a JSON form is not one this module wrote)."""


def encode(value: Any) -> Any:
    """The JSON form of ``value``.

    Raises:
        Unencodable: for values outside the supported kinds (tensors, modules, objects).

    Example:
        >>> encode((1, slice(None, 2), torch.float16, ArgSlot(0)))
        {'$tuple': [1, {'$slice': [None, 2, None]}, {'$dtype': 'float16'}, {'$slot': 0}]}
    """
    return _encode(value, None)


def encode_output(template: Any) -> tuple[Any, list[str]]:
    """The JSON form of an output template, containers written as look-alikes, and the
    type names of the values written as ``$dropped`` (they load as None).

    Raises:
        Unencodable: for a dict key with no JSON form.

    Example:
        >>> from collections import OrderedDict
        >>> encode_output(OrderedDict(logits=ArgSlot(0), cache=object()))
        ({'$odict': [['logits', {'$slot': 0}], ['cache', {'$dropped': 'object'}]]}, ['object'])
    """
    dropped: list[str] = []
    return _encode(template, dropped), dropped


def _encode(value: Any, dropped: list[str] | None) -> Any:
    """``dropped`` is None for strict encoding, else where look-alike encoding notes what
    it drops."""
    kind = type(value)
    if value is None or kind in (bool, int, str):
        return value
    if kind is float:
        return value if math.isfinite(value) else {"$float": repr(value)}
    if isinstance(value, str):  # str subclasses such as torch.__version__ save as text
        return str(value)
    if kind is list:
        return [_encode(item, dropped) for item in value]
    if kind is tuple:
        return {"$tuple": [_encode(item, dropped) for item in value]}
    if kind is dict or kind is OrderedDict:
        return {"$dict" if kind is dict else "$odict": _encode_pairs(value, dropped)}
    for tag, (cls, to_json, _) in _TAGGED.items():
        if kind is cls:
            return {tag: to_json(value)}
    if dropped is not None:
        return _encode_lookalike(value, dropped)
    raise Unencodable(f"values of type {kind.__name__} cannot be saved")


def _encode_pairs(mapping: dict, dropped: list[str] | None) -> list:
    return [[_encode(k, None), _encode(v, dropped)] for k, v in mapping.items()]


def _encode_lookalike(value: Any, dropped: list[str]) -> Any:
    """A container of a class the file cannot name, as plain data; anything else dropped."""
    kind = type(value)
    if isinstance(value, dict):
        tag = "$odict" if isinstance(value, OrderedDict) else "$dict"
        return {tag: _encode_pairs(value, dropped)}
    if isinstance(value, (list, tuple)):
        items = [_encode(item, dropped) for item in value]
        fields = getattr(value, "_fields", None) or getattr(kind, "__match_args__", None)
        if isinstance(value, tuple) and _buildable(_namedtuple, kind.__name__, fields, items):
            return {"$namedtuple": [kind.__name__, list(fields), items]}
        return {"$tuple": items} if isinstance(value, tuple) else items
    if kind is TemplateDataclass:
        name, fields = value.cls.__name__, list(value.fields)
        if _buildable(_dataclass, name, fields, fields):
            pairs = [[key, _encode(item, dropped)] for key, item in value.fields.items()]
            return {"$dataclass": [name, pairs]}
    dropped.append(kind.__name__)
    return {"$dropped": kind.__name__}


def _buildable(make: Callable, name: str, fields: Any, items: list) -> bool:
    """Whether ``make`` can build a class ``name`` with one field per item."""
    if not isinstance(fields, tuple | list) or len(fields) != len(items):
        return False
    try:
        make(name, tuple(fields))
    except (TypeError, ValueError):
        return False
    return True


@lru_cache(maxsize=256)
def _namedtuple(name: str, fields: tuple[str, ...]) -> type:
    """A fresh namedtuple class (one per name and fields, so loaded values share it)."""
    return namedtuple(name, fields)


@lru_cache(maxsize=256)
def _dataclass(name: str, fields: tuple[str, ...]) -> type:
    """A fresh dataclass with ``fields`` (one per name and fields)."""
    return dataclasses.make_dataclass(name, fields)


def decode(data: Any) -> Any:
    """The value :func:`encode` wrote as ``data``.

    Raises:
        Unencodable: for JSON that :func:`encode` cannot have written.
    """
    if data is None or type(data) in (bool, int, float, str):
        return data
    if type(data) is list:
        return [decode(item) for item in data]
    if type(data) is not dict or len(data) != 1:
        raise Unencodable(f"unexpected JSON value {_short(data)}")
    ((tag, body),) = data.items()
    if tag == "$tuple":
        return tuple(decode(item) for item in _list(body))
    if tag == "$dict":
        return {_key(decode(pair[0])): decode(pair[1]) for pair in _pairs(body)}
    if tag == "$odict":
        return OrderedDict((_key(decode(pair[0])), decode(pair[1])) for pair in _pairs(body))
    entry = _TAGGED.get(tag)
    build = entry[2] if entry is not None else _LOOKALIKES.get(tag)
    if build is None:
        raise Unencodable(f"unknown tag {tag!r}")
    try:
        return build(body)
    except (TypeError, ValueError, AttributeError, OverflowError) as err:
        raise Unencodable(f"bad {tag} value {_short(body)}: {err}") from None


def _torch_attr(kind: type) -> Callable[[Any], Any]:
    """Read ``torch.<name>`` and accept it only if it is an instance of ``kind``."""

    def read(name: Any) -> Any:
        value = getattr(torch, name, None) if isinstance(name, str) else None
        if type(value) is not kind:
            raise ValueError(f"torch.{name} is not a {kind.__name__}")
        return value

    return read


def _slice(body: Any) -> slice:
    return slice(*(_scalar(decode(item)) for item in _list(body, 3)))


def _scalar(value: Any) -> Any:
    if value is not None and type(value) not in (bool, int, float, ArgSlot):  # x[:, a:b]
        raise ValueError("slice bounds are numbers or null")
    return value


def _namedtuple_value(body: Any) -> Any:
    name, fields, items = _list(body, 3)
    if not isinstance(name, str) or not all(isinstance(f, str) for f in _list(fields)):
        raise ValueError("a $namedtuple has a name and field names")
    items = _list(items, len(fields))
    return _namedtuple(name, tuple(fields))(*(decode(item) for item in items))


def _dataclass_template(body: Any) -> TemplateDataclass:
    name, pairs = _list(body, 2)
    fields = {pair[0]: decode(pair[1]) for pair in _pairs(pairs)}
    if not isinstance(name, str) or not all(isinstance(f, str) for f in fields):
        raise ValueError("a $dataclass has a name and field names")
    return TemplateDataclass(_dataclass(name, tuple(fields)), fields)


def _float(body: Any) -> float:
    if body not in ("nan", "inf", "-inf"):
        raise ValueError("expected nan, inf or -inf")
    return float(body)


def _complex(body: Any) -> complex:
    return complex(*(_number(decode(part)) for part in _list(body, 2)))


def _number(value: Any) -> float:
    if type(value) not in (int, float):
        raise ValueError("expected a number")
    return float(value)


def _size(body: Any) -> torch.Size:
    dims = _list(body)
    if not all(type(d) is int for d in dims):
        raise ValueError("sizes are integers")
    return torch.Size(dims)


def _slot(body: Any) -> ArgSlot:
    if type(body) is not int or body < 0:
        raise ValueError("slots are non-negative integers")
    return ArgSlot(body)


def _device(body: Any) -> torch.device:
    if not isinstance(body, str):
        raise ValueError("devices are strings")
    return torch.device(body)


def _list(body: Any, length: int | None = None) -> list:
    if type(body) is not list or (length is not None and len(body) != length):
        raise Unencodable(f"expected a list, got {_short(body)}")
    return body


def _pairs(body: Any) -> list:
    pairs = _list(body)
    if not all(type(p) is list and len(p) == 2 for p in pairs):
        raise Unencodable("a $dict holds [key, value] pairs")
    return pairs


def _key(key: Any) -> Any:
    try:
        hash(key)
    except TypeError:
        raise Unencodable(f"unhashable dict key {_short(key)}") from None
    return key


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) < 60 else text[:57] + "..."


def _name(value: Any) -> str:
    return str(value).removeprefix("torch.")


# tag -> (exact type, to JSON, from JSON)
_TAGGED: dict[str, tuple[type, Callable[[Any], Any], Callable[[Any], Any]]] = {
    "$float": (float, repr, _float),
    "$complex": (complex, lambda c: [encode(c.real), encode(c.imag)], _complex),
    "$slice": (slice, lambda s: [encode(s.start), encode(s.stop), encode(s.step)], _slice),
    "$ellipsis": (type(Ellipsis), lambda _: None, lambda _: Ellipsis),
    "$slot": (ArgSlot, lambda s: s.index, _slot),
    "$size": (torch.Size, list, _size),
    "$dtype": (torch.dtype, _name, _torch_attr(torch.dtype)),
    "$device": (torch.device, str, _device),
    "$memory_format": (torch.memory_format, _name, _torch_attr(torch.memory_format)),
    "$layout": (torch.layout, _name, _torch_attr(torch.layout)),
}
# tag -> from JSON, for the look-alikes only encode_output writes
_LOOKALIKES: dict[str, Callable[[Any], Any]] = {
    "$namedtuple": _namedtuple_value,
    "$dataclass": _dataclass_template,
    "$dropped": lambda _: None,
}
