"""Escapes and hidden edges: where a tensor's value left torch for Python, and what it fed.

An :class:`Escape` is its own record, not an :class:`~torchlens.trace.Op`: ``.item()``,
``.tolist()``, ``.numpy()``, ``bool(t)`` (``if t.any():``) and the like produce a Python
value, not a tensor. An op that later uses that value holds it as a constant, so the graph
has no edge for it. Validation (``docs/validation.md``) perturbs escaped values and adds
each dependency it proves as a :class:`HiddenEdge`: a separate edge kind, never mixed into
``Op.parents``, which keep meaning "tensor arguments of the call".
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

__all__ = ["Escape", "HiddenEdge", "short_repr"]

_REPR_LIMIT = 60
_WRITTEN = {"array": "np.asarray()", "contains": "in"}  # dunders not written as calls


def short_repr(value: Any) -> str:
    """``repr(value)`` cut to about 60 characters (an escaped list or array can be long)."""
    try:
        text = repr(value)
    except Exception:  # any __repr__ may raise
        text = f"<{type(value).__name__}>"
    text = " ".join(text.split())
    return text if len(text) <= _REPR_LIMIT else text[: _REPR_LIMIT - 3] + "..."


def _where(source: tuple | None) -> str:
    if not source:
        return ""
    return f" at {os.path.basename(str(source[0]))}:{source[1]}"


@dataclass(frozen=True)
class Escape:
    """One read of a recorded value by Python: which record, through which call, what value.

    Example:
        >>> str(Escape("mean_1", "item", "0.53", "float", 4, 0, ("model.py", 12, "forward")))
        'mean_1 .item() -> 0.53 at model.py:12'
    """

    label: str  # the op (or source) whose value left
    via: str  # "item", "tolist", "numpy", "__array__", "__bool__", "__int__", "__float__", ...
    value: str  # the Python value it gave, as a short repr
    type: str  # that value's type name: "float", "int", "bool", "list", "ndarray", "str"...
    index: int  # its place in the op order: the number of ops recorded before it
    call: int  # which escaping call, 0-based (one call reading two tensors gives two records)
    source: tuple[str, int, str] | None = None  # (file, line, function) of the model's line

    @property
    def control(self) -> bool:
        """Whether the value is a bool: what ``if t:`` and ``assert`` read (a branch)."""
        return self.type == "bool"

    @property
    def call_text(self) -> str:
        """The call as written: ``.item()``, ``bool()``, ``np.asarray()``, ``in``..."""
        if self.via.startswith("__"):
            stem = self.via[2:-2]
            return _WRITTEN.get(stem, f"{stem}()")
        return f".{self.via}()"

    def __str__(self) -> str:
        return f"{self.label} {self.call_text} -> {self.value}{_where(self.source)}"


@dataclass(frozen=True)
class HiddenEdge:
    """A dependency validation proved that no recorded edge carries: ``child`` reads
    ``parent``'s value through an escape (perturbing the escaped value moved ``child``).

    Example:
        >>> str(HiddenEdge("mean_1", "mul_1", "item", ("model.py", 12, "forward")))
        'mean_1 -> mul_1 via .item() at model.py:12'
    """

    parent: str  # the record whose value escaped
    child: str  # the op (or constant) that moved when the escaped value was perturbed
    via: str  # the escaping call, as Escape.via
    source: tuple[str, int, str] | None = None  # the escape's line

    @property
    def call_text(self) -> str:
        """The escaping call as written: ``.item()``, ``bool()``..."""
        return Escape(self.parent, self.via, "", "", 0, 0).call_text

    def __str__(self) -> str:
        return f"{self.parent} -> {self.child} via {self.call_text}{_where(self.source)}"
