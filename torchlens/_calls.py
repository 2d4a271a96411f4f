"""The one rule for calling a user's function with an optional second argument.

``intervene=``, :meth:`Trace.rerun`, ``edits.edit_pattern`` (the op) and
``tl.extract(reduce=)`` (the batch) call a user function with a value and, when the function
asks for it, a second argument. A function asks for it in exactly two ways: it has two
*required* positional parameters (``lambda t, op: ...``), or it has a parameter named for
the second argument (``def f(t, op=None)``, ``def f(t, *, op)``). Anything else gets the
value alone, so ``lambda t, h=h: ...`` (a loop variable captured by a default, the usual
Python idiom) keeps its default instead of silently receiving the op.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

__all__ = ["with_second"]

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def with_second(fn: Callable[..., Any], name: str) -> Callable[[Any, Any], Any] | None:
    """``fn`` as ``g(value, second)``, passing ``second`` only when ``fn`` asks for it.

    Args:
        fn: the user's function.
        name: the second argument's name (``"op"``, ``"batch"``); a parameter of that name
            receives it, by keyword unless it is the second required positional parameter.

    Returns:
        A two-argument function, or None when ``fn`` can be called neither as ``fn(value)``
        nor as ``fn(value, second)`` (the caller raises its own typed error). A callable
        whose signature cannot be read (some builtins) gets the value alone.
    """
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return lambda value, second: fn(value)
    params = list(signature.parameters.values())
    required = [p for p in params if p.kind in _POSITIONAL and p.default is p.empty]
    named = signature.parameters.get(name)
    if len(required) == 2:
        return fn
    if named is not None and named.kind is not inspect.Parameter.POSITIONAL_ONLY:
        if _binds(signature, (0,), {name: 0}):
            return lambda value, second: fn(value, **{name: second})
    if _binds(signature, (0,), {}):
        return lambda value, second: fn(value)
    return None


def _binds(signature: inspect.Signature, args: tuple, kwargs: dict) -> bool:
    try:
        signature.bind(*args, **kwargs)
    except TypeError:
        return False
    return True
