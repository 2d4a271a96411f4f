"""Attention patterns of ``scaled_dot_product_attention`` ops, rebuilt from their inputs.

``F.scaled_dot_product_attention`` (what transformers 5 uses by default, and
``nn.MultiheadAttention`` with ``need_weights=False``) is one fused op: the probabilities it
computes are never a tensor of the forward, so there is no ``softmax`` op to select. They
follow from the op's saved inputs: ``softmax(q @ k^T * scale + bias)``, with ``bias`` the
mask (boolean masks add ``-inf`` where False) and the causal triangle, ``k`` repeated over
query heads under ``enable_gqa``. Dropout is left out: the pattern is what an eval forward
attends with. :func:`attention_pattern` gives it; :func:`attend` turns a pattern (edited,
say) back into the op's output, ``pattern @ v``.

Example:
    >>> import torch, torch.nn.functional as F, torchlens as tl
    >>> q, k, v = torch.randn(3, 1, 2, 4, 8).unbind(0)
    >>> trace = tl.trace(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), (q, k, v))
    >>> pattern = tl.attention_pattern(trace["scaled_dot_product_attention_1"])
    >>> pattern.shape, bool(torch.allclose(pattern.sum(-1), torch.ones(1, 2, 4)))
    (torch.Size([1, 2, 4, 4]), True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from torchlens.capture import fill
from torchlens.errors import InvalidArgumentError, PayloadUnavailableError
from torchlens.trace import lookup_of

__all__ = [
    "AttentionInputs",
    "attention_inputs",
    "attention_pattern",
    "attend",
    "pack_pattern",
    "packed_query",
    "SDPA",
]

Tensor = torch.Tensor
SDPA = "scaled_dot_product_attention"  # the op's func_name


@dataclass(frozen=True)
class AttentionInputs:
    """What one ``scaled_dot_product_attention`` call was given, by name."""

    query: Tensor  # (..., heads, queries, dim)
    key: Tensor  # (..., kv heads, keys, dim)
    value: Tensor  # (..., kv heads, keys, value dim)
    attn_mask: Tensor | None  # bool (True: attend) or added to the scores; broadcasts
    is_causal: bool
    scale: float | None  # None: 1 / sqrt(dim)
    enable_gqa: bool  # key and value have fewer heads, each shared by a group of queries
    dropout_p: float  # ignored by the pattern (see the module docstring)


def _bind(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> AttentionInputs:
    """``F.scaled_dot_product_attention``'s signature, binding a recorded call."""
    return AttentionInputs(
        query, key, value, attn_mask, bool(is_causal), scale, bool(enable_gqa), float(dropout_p)
    )


def attention_inputs(op: Any) -> AttentionInputs:
    """The inputs of a recorded ``scaled_dot_product_attention`` op: its saved tensors
    (q, k, v, the mask) and its recorded options.

    Args:
        op: an op of a trace (``trace["scaled_dot_product_attention_1"]``), or the op an
            ``intervene=`` function is handed.

    Returns:
        An :class:`AttentionInputs`.

    Raises:
        InvalidArgumentError: ``not_attention`` when ``op`` is not a
            ``scaled_dot_product_attention`` op of a trace.
        PayloadUnavailableError: ``not_saved`` (or the store's own code) when a tensor
            argument's value was not kept.

    Example:
        >>> import torch, torch.nn.functional as F, torchlens as tl
        >>> q = torch.randn(1, 2, 3, 4)
        >>> fn = lambda q: F.scaled_dot_product_attention(q, q, q, is_causal=True)
        >>> inputs = attention_inputs(tl.trace(fn, q)["scaled_dot_product_attention_1"])
        >>> inputs.is_causal, inputs.attn_mask, inputs.query.shape
        (True, None, torch.Size([1, 2, 3, 4]))
    """
    name = getattr(op, "func_name", None)
    label = getattr(op, "label", repr(op))
    if name == SDPA and not hasattr(op, "args_template"):  # a tl.record view
        raise InvalidArgumentError(
            f"{label!r} comes from tl.record, which keeps no inputs of its ops; rebuild "
            "its pattern from an op of tl.trace, which keeps them",
            code="not_attention",
        )
    if name != SDPA or not hasattr(op, "parent_args"):
        raise InvalidArgumentError(
            f"{label!r} is a {name or type(op).__name__!r} op, not {SDPA}; pass an op "
            f"of a trace whose func_name is {SDPA!r} (tl.func({SDPA!r}) selects them)",
            code="not_attention",
        )
    store = op._store
    values = []
    for ref in op.parent_args:
        try:
            if store is None:
                raise PayloadUnavailableError("no values were kept", code="not_saved")
            values.append(store.get(ref.label))
        except PayloadUnavailableError as err:
            parents = ", ".join(f"tl.label({r.label!r})" for r in op.parent_args)
            raise PayloadUnavailableError(
                f"the attention pattern of {op.label!r} is rebuilt from its inputs, and the "
                f"value of {ref.label!r} was not kept ({err}); trace without save= (or with "
                f"a save= that also selects {parents}) and not structure_only",
                code=err.code,
            ) from None
    args = fill(op.args_template, values)
    kwargs = fill(op.kwargs_template, values)
    return _bind(*args, **kwargs)


def _pattern(inputs: AttentionInputs) -> Tensor:
    """``softmax(q k^T * scale + bias)`` in at least float32, cast back to q's dtype."""
    q, k = inputs.query, inputs.key
    work = torch.promote_types(q.dtype, torch.float32)
    q, k = q.to(work), k.to(work)
    if inputs.enable_gqa and k.dim() >= 3 and k.shape[-3] != q.shape[-3]:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
    scale = 1 / math.sqrt(q.shape[-1]) if inputs.scale is None else inputs.scale
    scores = (q @ k.transpose(-2, -1)) * scale
    n_q, n_k = q.shape[-2], k.shape[-2]
    if inputs.is_causal:
        allowed = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~allowed, float("-inf"))
    mask = inputs.attn_mask
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask.to(work)
    pattern = scores.softmax(-1)
    # a query that may attend to nothing gets zeros, as the kernels give it (not NaN)
    pattern = pattern.nan_to_num(0.0)
    return pattern.to(inputs.query.dtype)


def packed_query(op: Any, inputs: AttentionInputs) -> bool:
    """Whether ``op``'s query is one decoding step's query heads packed by key group.

    transformers' SDPA attention (``pack_gqa``), for one new token with shared key heads and
    a mask, reshapes the query ``(batch, heads, 1, dim)`` to ``(batch, kv_heads, n_rep,
    dim)`` and calls SDPA with ``n_rep`` "queries" per key head. The op alone cannot tell
    that from a real call of ``n_rep`` queries; the trace can: the query is then a
    ``reshape``/``view`` of a ``(..., kv_heads * n_rep, 1, dim)`` tensor.

    Raises:
        InvalidArgumentError: ``packed_query_unknown`` when the query may be packed (a
            reshape's output, several queries, as many heads as the key) but ``op`` belongs
            to no live trace, so its producer cannot be read.
    """
    q, k = inputs.query, inputs.key
    if inputs.enable_gqa or q.dim() < 3 or k.dim() < 3 or q.shape[-2] < 2:
        return False
    if q.shape[-3] != k.shape[-3] or not op.parent_args:
        return False
    label = op.parent_args[0].label
    lookup = lookup_of(op)
    if lookup is None:
        if label.rsplit("_", 1)[0] in ("reshape", "view"):
            raise InvalidArgumentError(
                f"the query of {op.label!r} may be one decoding step's heads packed by key "
                "group (transformers' pack_gqa), which only its trace can tell; read the "
                "pattern from an op of a live trace (trace[label])",
                code="packed_query_unknown",
            )
        return False
    producer = lookup(label)
    if producer is None or getattr(producer, "func_name", None) not in ("reshape", "view"):
        return False
    source = lookup(producer.parent_args[0].label) if producer.parent_args else None
    unpacked = (*q.shape[:-3], q.shape[-3] * q.shape[-2], 1, q.shape[-1])
    return source is not None and tuple(getattr(source, "shape", ())) == unpacked


def pack_pattern(pattern: Tensor, inputs: AttentionInputs) -> Tensor:
    """Undo :func:`attention_pattern`'s unpacking, to the query's packed shape: an edited
    pattern goes back into the op's layout (``trace.rerun``'s attention edits, in ``edits``).

    Args:
        pattern: a pattern in ``(..., heads, 1, keys)`` form.
        inputs: the op's :class:`AttentionInputs`, whose query gives the packed shape.

    Returns:
        ``pattern`` reshaped to ``(..., query heads, queries, keys)`` of the query.
    """
    q = inputs.query
    return pattern.reshape(*pattern.shape[:-3], q.shape[-3], q.shape[-2], pattern.shape[-1])


def attention_pattern(op: Any) -> Tensor:
    """The attention probabilities of a ``scaled_dot_product_attention`` op,
    ``(batch, heads, queries, keys)``, rebuilt from its saved q and k, its mask,
    ``is_causal``, ``scale`` and ``enable_gqa`` (key heads repeated over their query
    group), without dropout.

    It equals the ``softmax`` that eager attention computes on the same weights
    (transformers' ``attn_implementation="eager"``), and ``pattern @ v`` is the op's output.
    A query with no key to attend to (a fully masked row: a padding position under left
    padding) gets zeros, as the kernel computes it; eager attention, which masks with the
    dtype's minimum rather than ``-inf``, spreads such a row evenly over the keys.

    Args:
        op: the op (``trace["scaled_dot_product_attention_1"]``); q and k must have been
            saved (the default ``tl.trace`` keeps every value).

    A decoding step whose query transformers packed by key group (see
    :func:`packed_query`) gives the same ``(batch, heads, 1, keys)`` as an unpacked one:
    query heads, not key groups.

    Returns:
        The pattern, in q's dtype (computed in at least float32); rows sum to 1.

    Raises:
        InvalidArgumentError: ``not_attention`` when ``op`` is not a
            ``scaled_dot_product_attention`` op of a trace.
        PayloadUnavailableError: ``not_saved`` when q, k or the mask was not kept.
        InvalidArgumentError: ``packed_query_unknown`` (see :func:`packed_query`).

    Example:
        >>> import torch, torch.nn.functional as F, torchlens as tl
        >>> q = torch.randn(1, 1, 3, 4)
        >>> fn = lambda q: F.scaled_dot_product_attention(q, q, q, is_causal=True)
        >>> pattern = attention_pattern(tl.trace(fn, q)["scaled_dot_product_attention_1"])
        >>> pattern[0, 0, 0].tolist()  # the first query sees only the first key
        [1.0, 0.0, 0.0]
    """
    inputs = attention_inputs(op)
    pattern = _pattern(inputs)
    if not packed_query(op, inputs):
        return pattern
    # (..., kv_heads, n_rep, keys) -> (..., heads, 1, keys): query head g * n_rep + r is [..., g, r]
    *lead, groups, n_rep, keys = pattern.shape
    return pattern.reshape(*lead, groups * n_rep, 1, keys)


def attend(pattern: Tensor, inputs: AttentionInputs) -> Tensor:
    """``pattern @ v``: the output of the attention call ``inputs`` describes, had it
    attended with ``pattern`` (value heads repeated over their query group under
    ``enable_gqa``), in v's dtype.

    Raises:
        InvalidArgumentError: ``bad_pattern`` when ``pattern`` is not
            ``(..., heads, queries, keys)`` for these inputs.

    Example:
        >>> import torch
        >>> q, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4)
        >>> inputs = AttentionInputs(q, q, v, None, False, None, False, 0.0)
        >>> torch.equal(attend(torch.eye(3).expand(1, 2, 3, 3), inputs), v)
        True
    """
    v = inputs.value
    if inputs.enable_gqa and v.dim() >= 3 and v.shape[-3] != inputs.query.shape[-3]:
        v = v.repeat_interleave(inputs.query.shape[-3] // v.shape[-3], dim=-3)
    want = (*inputs.query.shape[:-1], inputs.key.shape[-2])
    if not isinstance(pattern, torch.Tensor) or tuple(pattern.shape[-3:]) != tuple(want[-3:]):
        got = tuple(pattern.shape) if isinstance(pattern, torch.Tensor) else type(pattern)
        raise InvalidArgumentError(
            f"a pattern of {got} does not fit this attention call: it must be (..., heads, "
            f"queries, keys) = {want}; edit the pattern without changing its shape",
            code="bad_pattern",
        )
    work = torch.promote_types(v.dtype, pattern.dtype)
    return (pattern.to(work) @ v.to(work)).to(v.dtype)
