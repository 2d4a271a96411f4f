"""An edit of what a ``scaled_dot_product_attention`` op attends with (its pattern)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from torchlens._calls import with_second
from torchlens.attention import (
    attend,
    attention_inputs,
    attention_pattern,
    pack_pattern,
    packed_query,
)
from torchlens.edits._helpers import _on_axis, _on_heads, not_comparable
from torchlens.errors import InterventionError, InvalidArgumentError

__all__ = ["edit_pattern", "patch_pattern"]

Tensor = torch.Tensor


def edit_pattern(fn: Callable[..., Tensor]) -> Callable[[Tensor, Any], Tensor]:
    """An ``intervene=`` (or ``rerun``) edit of a ``scaled_dot_product_attention`` op that
    changes what it attends with: the op's output becomes ``fn(pattern, op) @ v``.

    ``pattern`` is :func:`torchlens.attention_pattern` of the op, ``(batch, heads, queries,
    keys)``, rebuilt from the q and k the op reads in this run (the edited ones, when an
    earlier edit changed them); ``v`` is its value input (heads repeated under
    ``enable_gqa``). ``fn`` may take the pattern alone. The op's q, k and v must be saved
    (the default). The call's ``dropout_p`` is not applied: the output is what an eval
    forward attending with the edited pattern computes.

    Args:
        fn: ``fn(pattern, op) -> pattern`` (or ``fn(pattern)``), of the same shape.

    Returns:
        ``fn(t, op)`` for ``intervene=`` or ``trace.rerun``; select the attention ops
        with ``tl.func("scaled_dot_product_attention")`` (and a module, to pick a layer).

    Raises:
        InterventionError: ``bad_edit`` (when applied) when the selected op is not a
            ``scaled_dot_product_attention`` op or ``fn`` returns a pattern of another shape;
            ``PayloadUnavailableError`` when q, k or v were not saved.

    Example:
        >>> import torch, torch.nn.functional as F, torchlens as tl
        >>> q, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4)
        >>> fn = lambda q, v: F.scaled_dot_product_attention(q, q, v)
        >>> identity = edit_pattern(lambda p: torch.eye(3).expand_as(p))  # each token itself
        >>> sdpa = tl.func("scaled_dot_product_attention")
        >>> edited = tl.trace(fn, (q, v), intervene={sdpa: identity})
        >>> torch.allclose(edited.output, v)
        True
    """
    if not callable(fn):
        raise InvalidArgumentError(
            f"edit_pattern takes a function fn(pattern, op) -> pattern, got {type(fn).__name__}",
            code="bad_edit",
        )
    call = with_second(fn, "op")  # the op only when fn asks for it: the one rule
    if call is None:
        raise InvalidArgumentError(
            "edit_pattern's function takes neither (pattern) nor (pattern, op); write it as "
            "fn(pattern) -> pattern or fn(pattern, op) -> pattern",
            code="bad_edit",
        )

    def edit(t: Tensor, op: Any) -> Tensor:
        try:
            inputs = attention_inputs(op)
        except InvalidArgumentError as err:
            raise InterventionError(
                f"edit_pattern edits scaled_dot_product_attention ops of tl.trace: {err}",
                code="bad_edit",
            ) from None
        pattern = attention_pattern(op)  # query heads, even of a packed decoding step
        new = call(pattern, op)
        if not isinstance(new, Tensor) or tuple(new.shape) != tuple(pattern.shape):
            got = tuple(new.shape) if isinstance(new, Tensor) else type(new).__name__
            raise InterventionError(
                f"the edit_pattern function for {op.label!r} returned {got}; return a pattern "
                f"of the shape it was given, {tuple(pattern.shape)}",
                code="bad_edit",
            )
        if packed_query(op, inputs):  # back to the call's packed (kv_heads, n_rep) layout
            new = pack_pattern(new, inputs)
        return attend(new, inputs).to(t.dtype)

    return edit


def patch_pattern(
    source: Any, *, heads: Sequence[int] | None = None, positions: Sequence[int] | None = None
) -> Callable[[Tensor, Any], Tensor]:
    """Attention-pattern patching: an ``intervene=`` (or ``rerun``) edit of a
    ``scaled_dot_product_attention`` op that attends with ``source``'s pattern of the same
    op (another run of the model, e.g. the clean prompt), on the picked heads and query
    positions only.

    Args:
        source: a trace of the same model, with the values the pattern is rebuilt from.
        heads: head indices (axis 1 of ``(batch, heads, queries, keys)``); None: all.
        positions: query positions (axis 2); None: all.

    Returns:
        ``fn(t, op)`` for ``intervene=``, made by :func:`edit_pattern`.

    Raises:
        InterventionError: ``not_comparable`` (when applied) when ``source`` has no such op
            or its pattern has another shape; ``bad_edit`` for a head or position out of range.
    """

    def fn(pattern: Tensor, op: Any) -> Tensor:
        other = source.get(op.label)
        new = None if other is None else attention_pattern(other)
        if new is None or tuple(new.shape) != tuple(pattern.shape):
            have = None if new is None else tuple(new.shape)
            raise not_comparable(f"patch the pattern of {op.label!r}", tuple(pattern.shape), have)
        new = _on_axis(pattern, op, positions, -2, new.to(pattern), ("positions", "seq_dim"))
        return _on_heads(pattern, op, heads, 1, new)

    return edit_pattern(fn)
