"""Composite functions: torch functions written in Python on top of other torch calls, that a
capture opens instead of recording as one op.

A function mode normally sees ``F.multi_head_attention_forward`` as one call and runs it with
the mode switched off, so the in-projection, the split into heads, the scores, the softmax
and the out-projection all vanish into one opaque op. An *opened* function is recorded as a
group instead (a :class:`~torchlens.trace.ModuleCall` whose ``module_type`` is the function's
name and whose address is the enclosing module's address plus ``"." + name``): its body runs
with the capture on, each torch call inside it is an op, and the group's outputs are what the
function returned. Kernel-level calls (``scaled_dot_product_attention``, ``layer_norm``,
``conv2d``) are single ops and stay so.

Opened by default: :data:`DEFAULT_OPENED` (``F.multi_head_attention_forward``, which every
``nn.MultiheadAttention`` and ``nn.Transformer*`` layer calls). Open another with
:func:`open_function`. Opened at some calls only: :data:`OPENED_WHEN`, ``F.embedding`` and
``F.embedding_bag`` given ``max_norm``, whose bodies renormalize rows of the weight in place
(``embedding_renorm_``) before the lookup: a write into a parameter, recorded as the op it
is, so the lookup reads the written weight and replay starts from the weight before it.

How: the body is run through a private copy of the function whose own
``has_torch_function*`` checks answer False, so it does not hand itself back to the mode;
torch itself is never modified.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch.nn.functional as F

from torchlens.capture import naming
from torchlens.errors import InvalidArgumentError

__all__ = [
    "DEFAULT_OPENED",
    "OPENED_WHEN",
    "open_function",
    "close_function",
    "opened_body",
    "group_address",
]

DEFAULT_OPENED: tuple[Callable[..., Any], ...] = (F.multi_head_attention_forward,)
_CHECKS = ("has_torch_function", "has_torch_function_unary", "has_torch_function_variadic")
_BODIES: dict[Callable[..., Any], Callable[..., Any]] = {}


def _never(*args: Any) -> bool:
    return False


def _renormalizes(args: tuple, kwargs: dict) -> bool:
    """``F.embedding``/``F.embedding_bag`` given ``max_norm`` (4th argument of both): the
    call writes into its weight."""
    max_norm = kwargs["max_norm"] if "max_norm" in kwargs else (args[3:4] or (None,))[0]
    return max_norm is not None


OPENED_WHEN: dict[Callable[..., Any], Callable[[tuple, dict], bool]] = {
    F.embedding: _renormalizes,
    F.embedding_bag: _renormalizes,
}


def opened_body(func: Callable[..., Any]) -> Callable[..., Any]:
    """``func``'s body as a function that does not dispatch to torch function modes itself
    (the calls it makes still do); built once per function."""
    body = _BODIES.get(func)
    if body is None:
        scope = dict(func.__globals__)
        scope.update((name, _never) for name in _CHECKS if name in scope)
        body = types.FunctionType(
            func.__code__, scope, func.__name__, func.__defaults__, func.__closure__
        )
        body.__kwdefaults__ = func.__kwdefaults__
        _BODIES[func] = body
    return body


def group_address(parent: str, name: str) -> str:
    """The address of a group opened inside the module at ``parent`` (``""``: the root)."""
    return f"{parent}.{name}" if parent else name


def open_function(func: Callable[..., Any]) -> None:
    """Record ``func`` as a group of the torch ops it runs rather than as one op.

    ``func`` must be a Python function that hands itself to torch function modes through
    ``has_torch_function``/``handle_torch_function`` (as the functions of
    ``torch.nn.functional`` do); otherwise the capture never sees it as one call and
    there is nothing to open. Takes effect for captures started afterwards.

    Args:
        func: the function, e.g. ``torch.nn.functional.multi_head_attention_forward``.

    Raises:
        InvalidArgumentError: ``not_composite`` when ``func`` is not a Python function
            (a builtin kernel such as ``torch.nn.functional.linear`` has no body to open).

    Example:
        >>> import torch.nn.functional as F
        >>> from torchlens.capture.composite import open_function, close_function
        >>> open_function(F.multi_head_attention_forward)  # already open by default
        >>> close_function(F.multi_head_attention_forward)  # one opaque op again
        >>> open_function(F.multi_head_attention_forward)
    """
    if not isinstance(func, types.FunctionType):
        raise InvalidArgumentError(
            f"{getattr(func, '__name__', func)!r} is not a Python function, so it has no body "
            "of torch calls to open; only functions such as "
            "torch.nn.functional.multi_head_attention_forward can be opened",
            code="not_composite",
        )
    naming.OPENED.add(func)
    naming.forget(func)


def close_function(func: Callable[..., Any]) -> None:
    """Record ``func`` as one op again (undoes :func:`open_function`).

    Args:
        func: a function opened by default or by :func:`open_function`.

    Example:
        >>> import torch.nn.functional as F
        >>> from torchlens.capture.composite import close_function, open_function
        >>> close_function(F.multi_head_attention_forward)
        >>> open_function(F.multi_head_attention_forward)
    """
    naming.OPENED.discard(func)
    naming.OPENED_WHEN.pop(func, None)
    naming.forget(func)


naming.OPENED.update(DEFAULT_OPENED)
naming.OPENED_WHEN.update(OPENED_WHEN)
