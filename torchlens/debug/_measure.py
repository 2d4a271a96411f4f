"""How far apart two values of one op are: elementwise extremes, and the error relative to
the tensor's norm that ``tl.diff`` judges a pair by (see :mod:`torchlens.debug.diff`)."""

from __future__ import annotations

import math

import torch

from torchlens.replay import comparable, tolerance

__all__ = ["DIFFERS", "SAME", "compare_norms", "compare_values"]

SAME, DIFFERS = "same", "differs"


def compare_values(
    a: torch.Tensor, b: torch.Tensor, atol: float | None = None, rtol: float | None = None
) -> tuple[str, float, float]:
    """``(status, max abs diff, max rel diff)`` of two same-shaped values, at the looser
    tolerance of their two dtypes, the status judged elementwise (``isclose``); NaN
    matches NaN in the same place."""
    status, max_abs, max_rel, _, _ = _measure(a, b, atol, rtol, elementwise=True)
    return status, max_abs, max_rel


def compare_norms(
    a: torch.Tensor,
    b: torch.Tensor,
    atol: float | None = None,
    rtol: float | None = None,
    dtype: torch.dtype | None = None,
) -> tuple[str, float, float, float, float]:
    """``(status, max abs diff, max rel diff, ||a - b|| / ||a||, cosine)`` of two
    same-shaped values; the status says whether ``rms(a - b) > atol + rtol * rms(a)`` at
    the looser tolerance of the two dtypes (and of ``dtype``, when given). Elements equal
    in both (NaN with NaN, the same infinity) count as no difference and stay out of the
    norms and the cosine."""
    return _measure(a, b, atol, rtol, elementwise=False, dtype=dtype)


def _measure(
    a: torch.Tensor,
    b: torch.Tensor,
    atol: float | None,
    rtol: float | None,
    elementwise: bool,
    dtype: torch.dtype | None = None,
) -> tuple[str, float, float, float, float]:
    x, y = comparable(a).cpu(), comparable(b).cpu()
    tols = [tolerance(d, atol, rtol) for d in (a.dtype, b.dtype, dtype) if d is not None]
    rtol_, atol_ = max(t[0] for t in tols), max(t[1] for t in tols)
    if x.numel() == 0:
        return SAME, 0.0, 0.0, 0.0, 1.0
    x, y = x.double(), y.double()
    both_nan = x.isnan() & y.isnan()
    equal = (x == y) | both_nan  # also equal infinities
    gap = (x - y).abs().masked_fill(equal, 0.0).nan_to_num(nan=math.inf, posinf=math.inf)
    scale = torch.maximum(x.abs(), y.abs()).nan_to_num(nan=math.inf, posinf=math.inf)
    # an infinity against a finite value: inf / inf, made inf
    rel = (gap / scale.clamp_min(torch.finfo(torch.float64).tiny)).nan_to_num(
        nan=math.inf, posinf=math.inf
    )
    finite = x.isfinite() & y.isfinite()
    xf, yf = x.masked_fill(~finite, 0.0), y.masked_fill(~finite, 0.0)
    norm_gap, norm_a, norm_b = float(gap.norm()), float(xf.norm()), float(yf.norm())
    rel_error = norm_gap / norm_a if norm_a > 0 else (0.0 if norm_gap == 0 else math.inf)
    if norm_a > 0 and norm_b > 0:
        cosine = float((xf * yf).sum()) / (norm_a * norm_b)
    else:
        cosine = 1.0 if norm_a == norm_b else 0.0
    if elementwise:
        close = bool((equal | (gap <= atol_ + rtol_ * y.abs())).all())
    else:
        root_n = math.sqrt(x.numel())
        close = norm_gap <= atol_ * root_n + rtol_ * norm_a
    status = SAME if close else DIFFERS
    max_rel = float(rel.masked_fill(equal, 0.0).max())
    return status, float(gap.max()), max_rel, rel_error, cosine
