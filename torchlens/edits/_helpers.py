"""The edit helpers; see the package docstring. Each returns ``fn(t, op) -> tensor``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from torchlens.errors import InterventionError

__all__ = ["add", "clamp", "mean", "project", "replace", "resample", "scale", "zero"]

Tensor = torch.Tensor
EditFn = Callable[[Tensor, Any], Tensor]
Heads = Sequence[int] | None
Positions = Sequence[int] | None


def _fail(op: Any, message: str) -> InterventionError:
    return InterventionError(
        f"cannot edit {op.label!r} of shape {tuple(op.shape)}: {message}", code="bad_edit"
    )


def _axis(t: Tensor, op: Any, dim: int, what: str) -> int:
    if not -t.dim() <= dim < t.dim():
        raise _fail(
            op,
            f"{what}={dim} is not an axis of a {t.dim()}-d tensor; pick one of "
            f"{-t.dim()}..{t.dim() - 1}",
        )
    return dim % t.dim()


def _on_heads(
    t: Tensor, op: Any, heads: Heads, head_dim: int, new: Tensor, n_heads: int | None = None
) -> Tensor:
    """``new`` on the picked heads of axis ``head_dim``, ``t`` elsewhere; with ``n_heads``,
    the heads are ``n_heads`` equal slices of the last axis (``d`` of ``(batch, tokens,
    d)``: the attention output projection's input)."""
    if heads is None or n_heads is None:
        return _on_axis(t, op, heads, head_dim, new, ("heads", "head_dim"))
    split = split_heads(t, op, n_heads)
    picked = _on_axis(split, op, heads, -2, split_heads(new.expand_as(t), op, n_heads),
                      ("heads", "n_heads"))  # fmt: skip
    return picked.flatten(-2)


def split_heads(t: Tensor, op: Any, n_heads: int) -> Tensor:
    """``t`` with its last axis ``d`` viewed as ``(n_heads, d // n_heads)``."""
    d = t.shape[-1] if t.dim() else 0
    if not isinstance(n_heads, int) or n_heads < 1 or d % n_heads:
        raise _fail(
            op,
            f"n_heads={n_heads!r} does not split its last axis of size {d} into equal heads; "
            "pass the model's number of attention heads",
        )
    return t.unflatten(-1, (n_heads, d // n_heads))


def check_head_axis(t: Tensor, op: Any, heads: Heads, head_dim: int, seq_dim: int, n_heads) -> None:
    """Refuse ``heads=`` whose ``head_dim`` is the position axis ``seq_dim``: on a
    ``(batch, tokens, d)`` site the default ``head_dim=1`` indexes tokens, not heads."""
    if heads is None or n_heads is not None:
        return
    if _axis(t, op, head_dim, "head_dim") == _axis(t, op, seq_dim, "seq_dim"):
        raise _fail(
            op,
            f"head_dim={head_dim} and seq_dim={seq_dim} name the same axis, so heads= would "
            "pick positions; a (batch, tokens, d) site has no head axis: pass n_heads= to "
            "split d into heads, or head_dim= for the axis that holds them",
        )


def _on_axis(
    t: Tensor, op: Any, picks: Heads, dim: int, new: Tensor, names: tuple[str, str]
) -> Tensor:
    """``new`` at the picked indices of axis ``dim`` (heads or positions), ``t`` elsewhere;
    ``names`` are the argument names to cite (``("heads", "head_dim")``)."""
    if picks is None:
        return new
    noun, dim_name = names
    axis = _axis(t, op, dim, dim_name)
    size = t.shape[axis]
    picked = [h + size if isinstance(h, int) and h < 0 else h for h in picks]  # heads=[-1]
    if not picked or any(not 0 <= h < size for h in picked):
        raise _fail(
            op,
            f"{noun}={list(picks)} are not indices along axis {axis} of size "
            f"{t.shape[axis]}; pass {dim_name}= for the axis that holds the {noun}",
        )
    index = torch.tensor(picked, device=t.device)
    return t.index_copy(axis, index, new.expand_as(t).index_select(axis, index))


def not_comparable(what: str, shape: tuple, have: tuple | None) -> InterventionError:
    """The source trace has no such op (``have`` None) or it has another shape."""
    found = "no such op" if have is None else f"shape {have}"
    return InterventionError(
        f"cannot {what} {shape} from the source trace ({found}); trace the same model on an "
        "input of the same shape",
        code="not_comparable",
    )


def _broadcast(t: Tensor, op: Any, value: Tensor, what: str) -> Tensor:
    value = torch.as_tensor(value, device=t.device).to(t.dtype)
    try:
        return value.expand_as(t)
    except RuntimeError:
        raise _fail(
            op, f"the {what} of shape {tuple(value.shape)} does not broadcast to {tuple(t.shape)}"
        ) from None


def zero(*, heads: Heads = None, head_dim: int = 1) -> EditFn:
    """Zero ablation: ``t' = 0`` (on the picked heads only, when ``heads`` is given).

    Args:
        heads: head indices along ``head_dim`` (negative ones count from the end); None
            edits the whole tensor.
        head_dim: the axis that holds the heads (1 for ``(batch, heads, tokens, dim)``).

    Returns:
        ``fn(t, op)`` for ``intervene=``.

    Raises:
        InterventionError: ``bad_edit`` (when applied) for a head or axis out of range.

    Example:
        >>> import torch
        >>> zero(heads=[1])(torch.ones(1, 2, 1), None).flatten().tolist()
        [1.0, 0.0]
    """
    return lambda t, op: _on_heads(t, op, heads, head_dim, torch.zeros_like(t))


def mean(
    dim: int | Sequence[int] = 0,
    *,
    value: Tensor | None = None,
    heads: Heads = None,
    head_dim: int = 1,
) -> EditFn:
    """Mean ablation: ``t' = mean(t, dim)`` broadcast back over ``dim`` (the batch mean by
    default), or ``t' = value`` when a precomputed mean is supplied.

    Args:
        dim: the axis or axes to average over (ignored when ``value`` is given).
        value: a mean computed elsewhere (e.g. over a dataset), broadcastable to ``t``.
        heads: as for :func:`zero`.
        head_dim: as for :func:`zero`.

    Returns:
        ``fn(t, op)`` for ``intervene=``.

    Raises:
        InterventionError: ``bad_edit`` for an axis out of range, a ``value`` that does
            not broadcast to the op's shape, or axes of size 1 only (a batch of one: the
            mean would be the value itself).

    Example:
        >>> import torch
        >>> mean()(torch.tensor([[1.0], [3.0]]), None).flatten().tolist()
        [2.0, 2.0]
    """

    def fn(t: Tensor, op: Any) -> Tensor:
        if value is not None:
            new = _broadcast(t, op, value, "mean")
        else:
            dims = [_axis(t, op, d, "dim") for d in ([dim] if isinstance(dim, int) else dim)]
            if all(t.shape[d] == 1 for d in dims):  # a batch of one: the mean is t itself
                raise _fail(
                    op,
                    f"the mean over dim={dim} (of size 1) is the value itself, so the edit "
                    "would change nothing; pass value= (a mean over a dataset, e.g. from "
                    "tl.extract) or dim= an axis with more than one entry",
                )
            new = t.mean(dim=dims, keepdim=True).expand_as(t)
        return _on_heads(t, op, heads, head_dim, new)

    return fn


def scale(factor: float, *, heads: Heads = None, head_dim: int = 1) -> EditFn:
    """Scaling: ``t' = factor * t``.

    Example:
        >>> import torch
        >>> scale(2.0)(torch.ones(2), None).tolist()
        [2.0, 2.0]
    """
    return lambda t, op: _on_heads(t, op, heads, head_dim, t * factor)


def clamp(
    min: float | None = None, max: float | None = None, *, heads: Heads = None, head_dim: int = 1
) -> EditFn:
    """Clamping: ``t' = min(max(t, min), max)``.

    Example:
        >>> import torch
        >>> clamp(max=0.5)(torch.tensor([0.0, 1.0]), None).tolist()
        [0.0, 0.5]
    """
    return lambda t, op: _on_heads(t, op, heads, head_dim, t.clamp(min=min, max=max))


def add(
    vector: Tensor,
    *,
    dim: int = -1,
    alpha: float = 1.0,
    heads: Heads = None,
    head_dim: int = 1,
) -> EditFn:
    """Steering: ``t' = t + alpha * v``, the 1-d vector ``v`` laid along axis ``dim`` (the
    feature axis) and broadcast over the others.

    Raises:
        InterventionError: ``bad_edit`` when ``v`` is not 1-d or its length is not the
            size of axis ``dim``.

    Example:
        >>> import torch
        >>> add(torch.tensor([1.0, 0.0]), alpha=2.0)(torch.zeros(3, 2), None)[0].tolist()
        [2.0, 0.0]
    """

    def fn(t: Tensor, op: Any) -> Tensor:
        axis = _axis(t, op, dim, "dim")
        v = torch.as_tensor(vector, device=t.device).to(t.dtype)
        if v.dim() != 1 or v.shape[0] != t.shape[axis]:
            raise _fail(
                op,
                f"the steering vector has shape {tuple(v.shape)}; it must be 1-d "
                f"of length {t.shape[axis]} (the size of axis {axis})",
            )
        shape = [1] * t.dim()
        shape[axis] = -1
        return _on_heads(t, op, heads, head_dim, t + alpha * v.view(shape))

    return fn


def project(directions: Tensor, *, dim: int = -1, keep: bool = False) -> EditFn:
    """Projection along axis ``dim`` onto the span of ``directions`` (``keep=True``:
    ``t' = P t``) or out of it (default: ``t' = t - P t``), with ``P = Q Q^T`` and ``Q`` an
    orthonormal basis of the span of the rows of ``directions`` (one direction ``(d,)`` or
    ``k`` of them as ``(k, d)``).

    Repeated or linearly dependent directions add nothing to the span, and a zero direction
    spans nothing: projecting out of it leaves ``t`` unchanged (``keep=True`` gives zeros).
    The basis is found by SVD, directions with singular values below
    ``max(k, d) * eps * largest`` counting as dependent. The arithmetic runs in float32 for
    bf16/fp16 activations (float64 for float64) and the result is cast back.

    Raises:
        InterventionError: ``bad_edit`` when the directions' length is not the size of
            axis ``dim``, or they hold NaN or infinity.

    Example:
        >>> import torch
        >>> project(torch.tensor([1.0, 0.0]))(torch.tensor([[3.0, 4.0]]), None).tolist()
        [[0.0, 4.0]]
    """

    def fn(t: Tensor, op: Any) -> Tensor:
        axis = _axis(t, op, dim, "dim")
        work = torch.promote_types(t.dtype, torch.float32)  # bf16/fp16/int -> float32
        d = torch.as_tensor(directions, device=t.device).to(work)
        d = d.unsqueeze(0) if d.dim() == 1 else d
        if d.dim() != 2 or d.shape[1] != t.shape[axis]:
            raise _fail(
                op,
                f"directions of shape {tuple(d.shape)} must have length "
                f"{t.shape[axis]} (the size of axis {axis})",
            )
        if not torch.isfinite(d).all():
            raise _fail(op, "the directions hold NaN or infinity; pass finite directions")
        basis = _row_basis(d)  # (rank, d), orthonormal rows
        moved = t.movedim(axis, -1).to(work)
        kept = (moved @ basis.mH) @ basis
        return (kept if keep else moved - kept).to(t.dtype).movedim(-1, axis)

    return fn


def _row_basis(d: Tensor) -> Tensor:
    """Orthonormal rows spanning the rows of ``d`` (none for a zero ``d``), by SVD."""
    if d.numel() == 0:
        return d[:0]
    _, s, vh = torch.linalg.svd(d, full_matrices=False)
    tol = s.max() * max(d.shape) * torch.finfo(s.dtype).eps
    rank = int((s > tol).sum())
    return vh[:rank]


def replace(value: Tensor) -> EditFn:
    """Replacement: ``t' = value`` (broadcast to the op's shape).

    Example:
        >>> import torch
        >>> replace(torch.tensor(5.0))(torch.zeros(2), None).tolist()
        [5.0, 5.0]
    """
    return lambda t, op: _broadcast(t, op, value, "replacement")


def resample(
    source: Any,
    *,
    heads: Heads = None,
    head_dim: int = 1,
    positions: Positions = None,
    seq_dim: int = -2,
    n_heads: int | None = None,
) -> EditFn:
    """Resample ablation: ``t' = source[op.label].out``, the same op's value in another
    trace of the same model (another input, e.g. a corrupted prompt).

    Args:
        source: a :class:`~torchlens.trace.Trace` of the same model that saved the op.
        heads: as for :func:`zero`.
        head_dim: as for :func:`zero`.
        positions: sequence positions along ``seq_dim`` to take from ``source`` (negative
            ones count from the end); the others keep their values. None takes them all.
        seq_dim: the axis that holds the positions: -2 is the token axis of the residual
            stream ``(batch, tokens, d)`` and of ``(batch, heads, tokens, head_dim)``.
        n_heads: split the last axis into this many equal heads, which ``heads=`` picks
            among (per-head patching of a ``(batch, tokens, d)`` site, such as the input of
            the attention output projection); ``head_dim`` is then unused.

    Raises:
        InterventionError: ``not_comparable`` when ``source`` has no op of that label or
            it has another shape; ``bad_edit`` for a position or axis out of range, for
            ``heads=`` whose ``head_dim`` is the position axis (pass ``n_heads=``), or an
            ``n_heads`` that does not divide the last axis.

    Example:
        >>> import torch, torchlens as tl
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
        >>> other = tl.trace(model, torch.randn(2, 4))
        >>> patch = {tl.label("relu_1"): resample(other)}
        >>> edited = tl.trace(model, torch.randn(2, 4), intervene=patch)
        >>> torch.equal(edited.output, other.output)
        True
    """

    def fn(t: Tensor, op: Any) -> Tensor:
        other = source.get(op.label)
        if other is None or tuple(other.shape) != tuple(t.shape):
            have = None if other is None else tuple(other.shape)
            raise not_comparable(f"resample {op.label!r} of shape", tuple(t.shape), have)
        check_head_axis(t, op, heads, head_dim, seq_dim, n_heads)
        value = other.out.to(t.device, t.dtype)
        new = _on_axis(t, op, positions, seq_dim, value, ("positions", "seq_dim"))
        return _on_heads(t, op, heads, head_dim, new, n_heads)

    return fn
