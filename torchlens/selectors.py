"""Selectors: which ops to save, edit or stop after, composable with ``&``, ``|`` and ``~``.

A selector is asked one question per op: does it match? It sees the op through a light view
with ``label``, ``func_name``, ``module``, ``module_stack``, ``shape``, ``dtype`` and ``index``
(a full :class:`~torchlens.trace.Op` inside ``tl.trace``, a small
:class:`~torchlens.recording.OpView` inside ``tl.record``).

Three facts let sparse recording skip most ops without asking: :attr:`Selector.func_names`
(the function names a selector can match at all; ``None`` for any),
:attr:`Selector.call_labels` (likewise the labels of the calls it can match) and
:attr:`Selector.static` (the answer depends only on the function name and the module
addresses, so it can be remembered per module path).

Example:
    >>> import torch, torchlens as tl
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    >>> trace = tl.trace(model, torch.randn(2, 4))
    >>> sel = tl.func("linear") & ~tl.module("2")
    >>> [op.label for op in trace if sel.matches(op)]
    ['linear_1']
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from torchlens._patterns import module_pattern
from torchlens.errors import InvalidArgumentError, SelectorMatchError

__all__ = [
    "Selector",
    "func",
    "module",
    "label",
    "layer",
    "needs_trace",
    "where",
    "as_selector",
    "Candidates",
    "module_pattern",
    "require_match",
]


class Selector:
    """Base class of every selector; combine them with ``&`` (and), ``|`` (or), ``~`` (not).

    A plain callable ``fn(op_view) -> bool`` can stand on either side of ``&`` and ``|``.
    """

    static: bool = False  # the answer depends only on func_name and module addresses
    func_names: frozenset[str] | None = None  # the only function names it can match
    call_labels: frozenset[str] | None = None  # the only call labels ("split_1") it can match
    at_exit: bool = False  # asks what a module call returned: answered when the call ends

    def matches(self, op: Any) -> bool:
        """Whether the op (an :class:`~torchlens.trace.Op` or a light view) is selected."""
        raise NotImplementedError

    def suggestions(self, seen: Candidates) -> list[str]:
        """Names close to what this selector asked for, for "matched nothing" errors."""
        return []

    def output_calls(self, op: Any) -> tuple[tuple[str, int, str], ...]:
        """The module calls, among those that returned ``op`` (``op.returned_by``), for
        whose output this selector picks it: what its ``tl.module(...).output`` parts
        matched (none when it picks ``op`` by other means only, or not at all).

        Example:
            >>> import torch, torchlens as tl
            >>> model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
            >>> rec = tl.record(model, torch.randn(2, 4), save=tl.module("*").output)
            >>> [tl.module("1").output.output_calls(op) for op in rec]
            [(), (('1', 1, 'ReLU'),)]
        """
        return ()

    def __call__(self, op: Any) -> bool:
        return self.matches(op)

    def __and__(self, other: Any) -> Selector:
        return _And(self, as_selector(other))

    def __rand__(self, other: Any) -> Selector:
        return _And(as_selector(other), self)

    def __or__(self, other: Any) -> Selector:
        return _Or(self, as_selector(other))

    def __ror__(self, other: Any) -> Selector:
        return _Or(as_selector(other), self)

    def __invert__(self) -> Selector:
        return _Not(self)


@dataclass(frozen=True)
class Candidates:
    """What a run offered to match against: function names, module addresses, op labels."""

    func_names: Iterable[str] = ()
    modules: Iterable[str] = ()
    labels: Iterable[str] = ()


def _close(word: str, options: Iterable[str]) -> list[str]:
    return difflib.get_close_matches(word, sorted(set(options)), n=5, cutoff=0.5)


# -- leaves ---------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class _Func(Selector):
    names: frozenset[str]
    static = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "func_names", self.names)

    def matches(self, op: Any) -> bool:
        return op.func_name in self.names

    def suggestions(self, seen: Candidates) -> list[str]:
        return [c for name in sorted(self.names) for c in _close(name, seen.func_names)]

    def __repr__(self) -> str:
        return f"func({', '.join(map(repr, sorted(self.names)))})"


@dataclass(frozen=True, eq=False)
class _Module(Selector):
    pattern: str
    call: frozenset[int] | None = None  # the call numbers picked (1 for the first)
    type_name: str | None = None  # the innermost module's class name must be this
    _regex: re.Pattern | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_regex", module_pattern(self.pattern))
        object.__setattr__(self, "static", self.call is None)

    def matches(self, op: Any) -> bool:
        if self.type_name is not None and op.module_type != self.type_name:
            return False
        if self.pattern == "":
            return self.call is None or self._root_call(op)
        if self.pattern == "*" and self.type_name is not None:  # type only: the innermost
            stack = op.module_stack  # call, at any address
            return bool(stack) and (self.call is None or stack[-1][1] in self.call)
        regex, pattern, call = self._regex, self.pattern, self.call
        for address, index in op.module_stack:  # (_picks inline: this runs per op)
            hit = regex.match(address) is not None if regex else address == pattern
            if hit and (call is None or index in call):
                return True
        return False

    def _picks(self, address: str, index: int) -> bool:
        """Whether the pattern and ``call=`` pick the module call ``address:index``."""
        if self.pattern == "*" and self.type_name is not None:  # type only: any address
            hit = True
        else:
            hit = self._regex.match(address) is not None if self._regex else address == self.pattern
        return hit and (self.call is None or index in self.call)

    def _root_call(self, op: Any) -> bool:
        """Whether ``op`` ran in a picked call of the root, numbered as module calls print
        them: ``<root>:0`` is the whole capture of a traced method (``model.generate``),
        whose forward calls, ``<root>:1``..., are on the op's module stack as ``("", k)``;
        a traced module's one call, ``<root>:1``, is around every op and on no stack (an op
        of a traced method outside its forward calls counts as in call 1 too)."""
        calls = [index for address, index in op.module_stack if address == ""]
        return 0 in self.call or any(c in self.call for c in calls or (1,))

    @property
    def output(self) -> Selector:
        """The op(s) each matching module call returned (not the ops inside it).

        Example:
            >>> module("layers.0").output
            module('layers.0').output
        """
        return _ModuleOutput(self)

    def suggestions(self, seen: Candidates) -> list[str]:
        modules = set(seen.modules)
        if self.pattern in modules:  # it exists: it ran no tensor op (or not that call)
            return [
                f"{self.pattern} (ran no tensor op{'' if self.call is None else ' in that call'})"
            ]
        # the same address below another name: a module a function called, named by its
        # class ("Sequential.0"), or one below a root= name ("unet.conv_in")
        below = sorted(m for m in modules if m.endswith("." + self.pattern))[:5]
        return below + [m for m in _close(self.pattern, modules) if m not in below]

    def __repr__(self) -> str:
        calls = sorted(self.call or ())
        shown = calls[0] if len(calls) == 1 else calls
        call = "" if self.call is None else f", call={shown}"
        kind = "" if self.type_name is None else f", type={self.type_name!r}"
        return f"module({self.pattern!r}{call}{kind})"


@dataclass(frozen=True, eq=False)
class _ModuleOutput(Selector):
    """``tl.module(...).output``: matches the ops whose value a matching module call
    returned, read from ``op.returned_by`` (filled when the call ends)."""

    calls: _Module
    at_exit = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "func_names", frozenset())  # nothing matches mid-call

    def matches(self, op: Any) -> bool:
        return any(map(self._picked, getattr(op, "returned_by", ())))

    def output_calls(self, op: Any) -> tuple[tuple[str, int, str], ...]:
        return tuple(filter(self._picked, getattr(op, "returned_by", ())))

    def _picked(self, returned: tuple[str, int, str]) -> bool:
        """Whether the module call ``(address, call, type)`` that returned an op is picked."""
        address, index, type_name = returned
        sel = self.calls
        return (sel.type_name is None or type_name == sel.type_name) and sel._picks(address, index)

    def suggestions(self, seen: Candidates) -> list[str]:
        return self.calls.suggestions(seen)

    def __repr__(self) -> str:
        return f"{self.calls!r}.output"


@dataclass(frozen=True, eq=False)
class _Label(Selector):
    labels: frozenset[str]

    def __post_init__(self) -> None:
        # "split_1" selects every output of that call; "linear_2" can only be a linear op
        calls = frozenset(lab.partition(":")[0] for lab in self.labels)
        object.__setattr__(self, "call_labels", calls)
        object.__setattr__(self, "func_names", frozenset(c.rpartition("_")[0] for c in calls))

    def matches(self, op: Any) -> bool:
        label = op.label
        return label in self.labels or label.partition(":")[0] in self.labels

    def suggestions(self, seen: Candidates) -> list[str]:
        return [c for lab in sorted(self.labels) for c in _close(lab, seen.labels) if c != lab]

    def __repr__(self) -> str:
        return f"label({', '.join(map(repr, sorted(self.labels)))})"


@dataclass(frozen=True, eq=False)
class _Layer(Selector):
    """``tl.layer(...)``: ops by their layer (``op.layer``) and pass (``op.pass_index``)."""

    names: frozenset[str]
    passes: frozenset[int] | None = None  # None: every pass

    def matches(self, op: Any) -> bool:
        if getattr(op, "_trace_ref", None) is None:
            raise InvalidArgumentError(
                f"{self!r} selects ops of a finished trace (layers are grouped after "
                "capture), not while one runs; use it with trace.summary(select), "
                "trace.rerun, tl.extract or [op for op in trace if sel(op)], or select the "
                "ops by tl.label(...) during capture",
                code="layer_needs_trace",
            )
        if op.layer not in self.names:
            return False
        return self.passes is None or op.pass_index in self.passes

    def suggestions(self, seen: Candidates) -> list[str]:
        return [c for name in sorted(self.names) for c in _close(name, seen.labels)]

    def __repr__(self) -> str:
        names = ", ".join(map(repr, sorted(self.names)))
        if self.passes is None:
            return f"layer({names})"
        return f"layer({names}, passes={sorted(self.passes)})"


@dataclass(frozen=True, eq=False)
class _Where(Selector):
    fn: Callable[[Any], bool]

    def matches(self, op: Any) -> bool:
        return bool(self.fn(op))

    def __repr__(self) -> str:
        return f"where({getattr(self.fn, '__qualname__', repr(self.fn))})"


# -- algebra --------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class _And(Selector):
    left: Selector
    right: Selector

    def __post_init__(self) -> None:
        for name in ("func_names", "call_labels"):  # None: any
            a, b = getattr(self.left, name), getattr(self.right, name)
            object.__setattr__(self, name, a if b is None else b if a is None else a & b)
        object.__setattr__(self, "static", self.left.static and self.right.static)
        object.__setattr__(self, "at_exit", self.left.at_exit or self.right.at_exit)

    def matches(self, op: Any) -> bool:
        left = self.left.matches(op)  # both asked: a selector may count the ops it sees
        return self.right.matches(op) and left

    def output_calls(self, op: Any) -> tuple[tuple[str, int, str], ...]:
        if not self.matches(op):
            return ()
        return _union(self.left.output_calls(op), self.right.output_calls(op))

    def suggestions(self, seen: Candidates) -> list[str]:
        return self.left.suggestions(seen) + self.right.suggestions(seen)

    def __repr__(self) -> str:
        return f"({self.left!r} & {self.right!r})"


@dataclass(frozen=True, eq=False)
class _Or(Selector):
    left: Selector
    right: Selector

    def __post_init__(self) -> None:
        for name in ("func_names", "call_labels"):  # None: any
            a, b = getattr(self.left, name), getattr(self.right, name)
            object.__setattr__(self, name, None if a is None or b is None else a | b)
        object.__setattr__(self, "static", self.left.static and self.right.static)
        object.__setattr__(self, "at_exit", self.left.at_exit or self.right.at_exit)

    def matches(self, op: Any) -> bool:
        left = self.left.matches(op)  # both asked: a selector may count the ops it sees
        return self.right.matches(op) or left

    @property
    def output(self) -> Selector:
        """What the module calls either side selects returned: ``(tl.module("a") |
        tl.module("b")).output`` is ``tl.module("a").output | tl.module("b").output``.

        Raises:
            InvalidArgumentError: ``bad_selector`` when a side is not a module selector.
        """
        sides = []
        for side in (self.left, self.right):
            if not isinstance(side, (_Module, _Or)):
                raise InvalidArgumentError(
                    f".output is what module calls returned; {side!r} in {self!r} is not a "
                    "tl.module(...) selector: combine module selectors only, or add "
                    ".output to each tl.module(...) part",
                    code="bad_selector",
                )
            sides.append(side.output)
        return _Or(*sides)

    def output_calls(self, op: Any) -> tuple[tuple[str, int, str], ...]:
        return _union(*(side.output_calls(op) for side in (self.left, self.right)
                        if side.matches(op)))  # fmt: skip

    def suggestions(self, seen: Candidates) -> list[str]:
        return self.left.suggestions(seen) + self.right.suggestions(seen)

    def __repr__(self) -> str:
        return f"({self.left!r} | {self.right!r})"


def _union(*calls: tuple[tuple[str, int, str], ...]) -> tuple[tuple[str, int, str], ...]:
    return tuple(dict.fromkeys(call for group in calls for call in group))


@dataclass(frozen=True, eq=False)
class _Not(Selector):
    inner: Selector

    def __post_init__(self) -> None:
        object.__setattr__(self, "static", self.inner.static)
        object.__setattr__(self, "at_exit", self.inner.at_exit)

    def matches(self, op: Any) -> bool:
        return not self.inner.matches(op)

    def __repr__(self) -> str:
        return f"~{self.inner!r}"


# -- public constructors --------------------------------------------------------------------
def _strings(values: tuple[Any, ...], what: str) -> frozenset[str]:
    if not values or not all(isinstance(v, str) and v for v in values):
        raise InvalidArgumentError(
            f"tl.{what}() takes one or more non-empty strings, got {values!r}",
            code="bad_selector",
        )
    return frozenset(values)


def func(*names: str) -> Selector:
    """Select ops by function name, as in labels (``"linear"``, ``"relu"``, ``"add_"``).

    Args:
        names: one or more function names; an op matches if its ``func_name`` is any of them.

    Returns:
        A :class:`Selector`.

    Raises:
        InvalidArgumentError: ``bad_selector`` when no name, or a non-string, is given.

    Example:
        >>> func("relu", "gelu")
        func('gelu', 'relu')
    """
    return _Func(_strings(names, "func"))


def module(
    pattern: str | None = None, call: int | None = None, *, type: type | str | None = None
) -> Selector:
    """Select the ops run inside a module call, nested submodules included; ``.output``
    selects what the call returned instead.

    ``tl.module("blocks.0").output`` matches the op(s) whose value the module's forward
    returned (every call, or the ``call=`` one), as a forward hook sees it: with
    ``intervene=`` the edit replaces the returned value, once, however many ops ran inside.
    An opened composite function (``capture/composite.py``) is a call too, at the
    enclosing module's address plus ``".multi_head_attention_forward"``.

    Args:
        pattern: a module address such as ``"layers.3"`` or a glob (see
            :func:`module_pattern`): ``*`` matches across dots, so ``"layers.*"`` is every
            module below ``layers`` (``layers.0``, ``layers.0.fc``, ...), while a ``+``
            segment matches one name, so ``"layers.+"`` is the direct children only.
            ``""`` (or ``"<root>"``) is the whole model. May be left out when ``type=`` is
            given (any address).
        call: only this call of the module (1 for the first), for modules called
            repeatedly, or several: ``range(2, 5)``, ``[1, 3]``. For the root, ``""`` or
            ``"<root>"``, the numbers are those module calls print: ``<root>:1`` of a traced
            module, ``<root>:0`` (the whole capture) and ``<root>:1``... (its forward calls)
            of a traced method such as ``model.generate``.
        type: only modules of this class (``nn.Linear`` or ``"Linear"``). An op matches when
            its innermost module is of that class; ``.output`` matches what every call of
            such a module returned, containers included.

    Returns:
        A :class:`Selector` with an ``.output`` selector.

    Raises:
        InvalidArgumentError: ``bad_selector`` for a pattern that is not a string, has an
            empty segment or a call number (``"layers.0:2"``), no pattern and no type, or a
            ``call=`` that is not a positive int or an iterable of them.

    Example:
        >>> import torch
        >>> module("layers.*", call=2)
        module('layers.*', call=2)
        >>> module(type=torch.nn.Linear).output
        module('*', type='Linear').output
    """
    if pattern is None and type is None:
        raise InvalidArgumentError(
            "tl.module() needs a module address (tl.module('layers.0')) or a class "
            "(tl.module(type=nn.Linear))",
            code="bad_selector",
        )
    if pattern is not None and not isinstance(pattern, str):
        raise InvalidArgumentError(
            f"tl.module() takes a module address string, got {pattern.__class__.__name__}",
            code="bad_selector",
        )
    if type is not None and not isinstance(type, str) and not hasattr(type, "__name__"):
        raise InvalidArgumentError(
            f"tl.module(type=...) takes a module class or its name, got {type!r}",
            code="bad_selector",
        )
    type_name = None if type is None else type if isinstance(type, str) else type.__name__
    pattern = "" if pattern == ROOT else pattern  # as module calls print the root
    return _Module("*" if pattern is None else pattern, _calls(call), type_name)


ROOT = "<root>"  # how module calls print the root (``"<root>:1"``); tl.module() takes it


def _calls(call: Any) -> frozenset[int] | None:
    """``call=`` as a set of call numbers: one int, or a range or other iterable of them."""
    if call is None:
        return None
    picks = [call] if isinstance(call, int) else None
    if picks is None and isinstance(call, Iterable) and not isinstance(call, (str, bytes)):
        picks = list(call)
    if not picks or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0
                            for c in picks):  # fmt: skip
        raise InvalidArgumentError(
            f"tl.module(call=...) takes a call number (1 for the first call; 0 for the whole "
            f"capture of a traced method, <root>:0), or a range or iterable of them, got "
            f"{call!r}",
            code="bad_selector",
        )
    return frozenset(picks)


def label(*labels: str) -> Selector:
    """Select ops by label (``"linear_2"``); a multi-output call's ``"split_1"`` selects
    all of its outputs (``"split_1:0"``, ``"split_1:1"``, ...).

    Example:
        >>> label("linear_2", "split_1")
        label('linear_2', 'split_1')
    """
    return _Label(_strings(labels, "label"))


def layer(*names: str, passes: int | Iterable[int] | None = None) -> Selector:
    """Select the ops of layers (``op.layer``: the ops that are the same code run again,
    ``docs/loops.md``), every pass or some; ``"linear_1:2"`` names one pass.

    Layers are grouped once a trace is finished, so this selects ops of a trace
    (``trace.summary(select)``, ``trace.rerun``, ``tl.extract``), not during a capture.

    Args:
        names: layer labels (``"linear_1"``, the label of the layer's first op), or
            ``"layer:pass"`` for one pass of it.
        passes: only these passes, numbered from 1: one number, or several (``range(2, 5)``
            for passes 2 to 4); every pass when left out.

    Returns:
        A :class:`Selector`.

    Raises:
        InvalidArgumentError: ``bad_selector`` for no name, a non-string, a pass below 1,
            or ``"layer:pass"`` together with ``passes=``; ``layer_needs_trace`` (when
            matched) during a capture.

    Example:
        >>> layer("linear_1", passes=range(2, 4))
        layer('linear_1', passes=[2, 3])
        >>> layer("linear_1:2")
        layer('linear_1', passes=[2])
    """
    from torchlens.layers import split_pass_key  # layers sit beside the data model

    chosen = _strings(names, "layer")
    split = [split_pass_key(name) for name in chosen]
    pinned = {number for _, number in split if number is not None}
    if pinned and (passes is not None or len(chosen) > 1):
        raise InvalidArgumentError(
            f"tl.layer({', '.join(map(repr, sorted(chosen)))}) names a pass in the label; "
            "give one 'layer:pass', or layer names with passes=",
            code="bad_selector",
        )
    if pinned:
        passes = pinned
    if isinstance(passes, int):
        passes = (passes,)
    numbers = None if passes is None else frozenset(passes)
    if numbers is not None and (
        not numbers or not all(isinstance(n, int) and n >= 1 for n in numbers)
    ):
        raise InvalidArgumentError(
            f"tl.layer(passes=...) takes pass numbers from 1, got {passes!r}",
            code="bad_selector",
        )
    return _Layer(frozenset(name for name, _ in split), numbers)


def needs_trace(selector: Selector) -> bool:
    """Whether ``selector`` asks what only a finished trace knows (``tl.layer``), so a
    capture cannot answer it op by op: ``tl.extract`` then resolves it on a trace first.

    Example:
        >>> needs_trace(func("relu") | layer("linear_1")), needs_trace(func("relu"))
        (True, False)
    """
    if isinstance(selector, _Layer):
        return True
    parts = (getattr(selector, name, None) for name in ("left", "right", "inner"))
    return any(needs_trace(part) for part in parts if isinstance(part, Selector))


def where(fn: Callable[[Any], bool]) -> Selector:
    """Select ops for which ``fn(op_view)`` is true; plain callables are wrapped this way.

    Example:
        >>> big = where(lambda op: op.shape and op.shape[-1] > 100)
    """
    if not callable(fn):
        raise InvalidArgumentError(
            f"tl.where() takes a callable, got {type(fn).__name__}", code="bad_selector"
        )
    return _Where(fn)


def as_selector(obj: Any) -> Selector:
    """``obj`` as a :class:`Selector`: selectors pass through, callables are wrapped.

    Raises:
        InvalidArgumentError: ``bad_selector`` for anything else (a bare string is refused:
            say ``tl.label(...)``, ``tl.func(...)`` or ``tl.module(...)``).
    """
    if isinstance(obj, Selector):
        return obj
    if callable(obj) and not isinstance(obj, str):
        return _Where(obj)
    hint = " (write tl.label(...), tl.func(...) or tl.module(...))" if isinstance(obj, str) else ""
    raise InvalidArgumentError(
        f"expected a selector or a callable taking an op, got {obj!r}{hint}",
        code="bad_selector",
    )


def require_match(selector: Selector, role: str, seen: Candidates) -> None:
    """Raise :class:`SelectorMatchError` for a ``role`` selector (``"save="``...) that
    matched no op, naming close function names, modules or labels."""
    close = list(dict.fromkeys(selector.suggestions(seen)))
    hint = f"; close names: {', '.join(close)}" if close else ""
    if "module(" in repr(selector) and not any(seen.modules):
        hint += (
            "; no module call was recorded: the traced callable called no nn.Module, so "
            "trace the module itself, or wrap the call in an nn.Module whose forward makes it"
        )
    hint += _fused_attention_hint(selector, seen) + _refresh_hint(selector, role)
    raise SelectorMatchError(
        f"the {role} selector {selector!r} matched no op of this forward{hint}; "
        "check the names against trace.labels or trace.modules",
        code="no_match",
    )


def _asked_labels(selector: Selector) -> set[str]:
    """The labels a selector names, through ``&``, ``|`` and ``~``."""
    if isinstance(selector, _Label):
        return set(selector.labels)
    parts = [getattr(selector, name, None) for name in ("left", "right", "inner")]
    return set().union(*(_asked_labels(p) for p in parts if isinstance(p, Selector)))


def _refresh_hint(selector: Selector, role: str) -> str:
    """Why a ``refresh_k`` label matched nothing: it is noted after a write, not called."""
    refresh = sorted(lab for lab in _asked_labels(selector) if lab.startswith("refresh_"))
    if not refresh:
        return ""
    return (
        f"; {', '.join(refresh)} {'is a refresh op' if len(refresh) == 1 else 'are refresh ops'}"
        ": a tensor's value after a write through another view, which tl.trace notes after "
        "the write and no function returned, so it is not an edit target and tl.record "
        f"does not see it (role {role}); select the in-place op that wrote the value, or "
        "the op that reads it"
    )


# what eager attention records and scaled_dot_product_attention computes inside one op
_INSIDE_SDPA = frozenset({"softmax", "_softmax", "safe_softmax", "_safe_softmax"})


def _fused_attention_hint(selector: Selector, seen: Candidates) -> str:
    """Why a softmax selector matched nothing in a forward that attends with SDPA."""
    names = selector.func_names
    if not names or not names & _INSIDE_SDPA:
        return ""
    if "scaled_dot_product_attention" not in set(seen.func_names):
        return ""
    return (
        "; this forward attends with scaled_dot_product_attention, one fused op whose "
        "softmax is not a tensor of the forward: select tl.func('scaled_dot_product_"
        "attention') and read the probabilities with tl.attention_pattern(op), or build "
        "the model with attn_implementation='eager' to record the softmax"
    )
