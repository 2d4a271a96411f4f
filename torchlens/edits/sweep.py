"""Patching sweeps and attribution patching: the daily experiments of circuit analysis.

:func:`sweep` patches a clean run's values into a corrupted one, one site (x position x
head) at a time, through :func:`~torchlens.edits.rerun`, and records a metric of each
patched output. :func:`attribution` estimates the same effects to first order, from the
corrupted run's gradient: ``(clean - corrupt) . d metric / d activation``, one backward
for every cell. Both return a :class:`~torchlens.edits.labelled.LabelledTensor` with the
axes ``site`` (and ``position``, ``head`` when asked for), so the two line up cell by cell.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from torchlens.capture import flatten, trace_candidates
from torchlens.edits._attention import patch_pattern
from torchlens.edits._helpers import _axis, check_head_axis, resample, split_heads
from torchlens.edits.labelled import LabelledTensor
from torchlens.edits.rerun import check_comparable, rerun_output
from torchlens.errors import GradUnavailableError, InterventionError, InvalidArgumentError
from torchlens.selectors import as_selector, label, require_match
from torchlens.trace import Trace

__all__ = ["attribution", "logit_diff", "sweep"]

Metric = Callable[[Any], Any]
Sites = Mapping[str, Any] | Sequence[Any]


def logit_diff(correct: int, wrong: int, *, position: int = -1, batch: int = 0) -> Metric:
    """The metric ``logits[batch, position, correct] - logits[batch, position, wrong]`` of
    a model output (a tensor, or an object with ``.logits`` such as a transformers output).

    Example:
        >>> import torch
        >>> logit_diff(0, 1)(torch.tensor([[[3.0, 1.0]]]))
        tensor(2.)
    """

    def metric(output: Any) -> torch.Tensor:
        logits = getattr(output, "logits", output)
        return logits[batch, position, correct] - logits[batch, position, wrong]

    return metric


def _number(value: Any) -> float:
    """A metric's value as a float (a 0-d tensor is detached first)."""
    return float(value.detach()) if isinstance(value, torch.Tensor) else float(value)


def _sites(trace: Trace, sites: Sites) -> list[tuple[str, list[str]]]:
    """``(name, labels of the ops it matches)`` per site, in order; names are the mapping's
    keys or the selectors' reprs."""
    named = list(sites.items()) if isinstance(sites, Mapping) else [(repr(s), s) for s in sites]
    out = []
    for name, select in named:
        selector = as_selector(select)
        labels = [op.label for op in trace.ops if op.func is not None and selector.matches(op)]
        if not labels:
            require_match(selector, f"site {name!r}", trace_candidates(trace))
        out.append((str(name), labels))
    return out


def _axes(sites: list, positions: Any, heads: Any) -> tuple[list[str], dict[str, list]]:
    dims, coords = ["site"], {"site": [name for name, _ in sites]}
    for dim, picks in (("position", positions), ("head", heads)):
        if picks is not None:
            dims.append(dim)
            coords[dim] = list(picks)
    return dims, coords


def _bar(total: int, progress: bool | None, desc: str) -> Any:
    from tqdm import tqdm

    shown = sys.stderr.isatty() if progress is None else progress
    return tqdm(total=total, desc=desc, disable=not shown, leave=False, dynamic_ncols=True)


def sweep(
    trace: Trace,
    source: Trace,
    sites: Sites,
    metric: Metric,
    *,
    positions: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    head_dim: int = 1,
    seq_dim: int = -2,
    progress: bool | None = None,
    n_heads: int | None = None,
    patch: str = "value",
) -> LabelledTensor:
    """Activation patching over sites x positions (x heads): each cell is
    ``metric(trace.rerun(patch(trace, source, site, positions=[p], heads=[h])).output)``,
    which equals the live ``tl.trace(model, x, intervene=...)`` with the same edit.

    Args:
        trace: the run to patch into (the corrupted prompt), with saved values.
        source: the run whose values are patched in (the clean prompt).
        sites: selectors of what to patch, as ``{name: selector}`` or a list (named by
            their repr); a site matching several ops patches them all at once.
        metric: maps the patched run's ``output`` to a number (``logit_diff(...)``).
        positions: one cell per position along ``seq_dim``; None patches whole values.
        heads: one cell per head along ``head_dim``; None patches all heads.
        head_dim: the axis that holds the heads.
        seq_dim: the axis that holds the positions (-2: tokens of ``(batch, tokens, d)``).
        progress: show a tqdm bar; None shows it on a terminal only.
        n_heads: split each site's last axis into this many heads for ``heads=``: per-head
            patching of a ``(batch, tokens, d)`` site (the attention output projection's
            input). Without it, ``heads=`` on a site whose ``head_dim`` is its position
            axis is refused (``bad_edit``).
        patch: ``"value"`` patches each site's value; ``"pattern"`` patches the attention
            pattern of ``scaled_dot_product_attention`` sites (:func:`patch_pattern`),
            ``positions`` then being query positions and ``heads`` axis 1 of the pattern.

    Returns:
        A :class:`LabelledTensor` of axes ``site`` (``position``, ``head``), ``meta``
        holding ``baseline`` (the metric of ``trace``) and ``source`` (of ``source``):
        ``(values - baseline) / (source - baseline)`` is the fraction restored.

    Raises:
        InterventionError: ``not_comparable`` when the traces differ; the errors of
            :func:`~torchlens.edits.rerun`.
        SelectorMatchError: ``no_match`` for a site that matches no op.

    Example:
        >>> import torch, torchlens as tl
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        >>> clean = tl.trace(model, torch.randn(1, 3, 4))
        >>> corrupt = tl.trace(model, torch.randn(1, 3, 4))
        >>> metric = lambda out: out.sum()
        >>> result = sweep(corrupt, clean, [tl.label("linear_1")], metric, positions=range(3))
        >>> result.dims, tuple(result.shape)
        (('site', 'position'), (1, 3))
    """
    check_comparable(trace, source)
    if patch not in ("value", "pattern"):
        raise InvalidArgumentError(
            f"sweep(patch={patch!r}): pass 'value' (activation patching) or 'pattern' "
            "(attention-pattern patching)",
            code="bad_edit",
        )
    found = _sites(trace, sites)
    # lists: a generator is read once
    positions, heads = (None if p is None else list(p) for p in (positions, heads))
    cells = list(itertools.product(*([None] if p is None else p for p in (positions, heads))))
    values = torch.empty(len(found) * len(cells), dtype=torch.float64)
    flat = flatten(trace.output)
    with _bar(len(values), progress, "tl.edits.sweep") as bar:
        for i, ((_, labels), (pos, head)) in enumerate(itertools.product(found, cells)):
            pick = {"positions": None if pos is None else [pos],
                    "heads": None if head is None else [head]}  # fmt: skip
            if patch == "pattern":
                edit = patch_pattern(source, **pick)
            else:
                edit = resample(source, head_dim=head_dim, seq_dim=seq_dim, n_heads=n_heads,
                                **pick)  # fmt: skip
            values[i] = _number(metric(rerun_output(trace, {label(*labels): edit}, flat)))
            bar.update()
    dims, coords = _axes(found, positions, heads)
    meta = {"baseline": _number(metric(trace.output)), "source": _number(metric(source.output))}
    shape = [len(coords[d]) for d in dims]
    return LabelledTensor(values.view(shape), dims, coords, name="metric", meta=meta)


def attribution(
    trace: Trace,
    source: Trace,
    sites: Sites,
    metric: Metric | None = None,
    *,
    positions: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    head_dim: int = 1,
    seq_dim: int = -2,
    n_heads: int | None = None,
) -> LabelledTensor:
    """Attribution patching: the first-order estimate of each cell of :func:`sweep`,
    ``(source - trace) . grad`` summed over each site's values (over the picked position
    and head), with ``grad = d metric / d value`` in ``trace``.

    One forward and one backward per run: ``trace`` (the corrupted run) is traced with
    ``save_grads=True``, and ``metric`` is backpropagated through it here (or pass
    ``metric=None`` after running ``trace.backward(metric)`` yourself). A value off the
    metric's path has a zero gradient.

    Args:
        trace: the corrupted run, traced with ``save_grads=True``.
        source: the clean run (values only).
        sites, positions, heads, head_dim, seq_dim, n_heads: as for :func:`sweep`.
        metric: maps ``trace.output`` to a scalar tensor with its graph.

    Returns:
        A :class:`LabelledTensor` of the same axes as :func:`sweep`'s; it estimates
        ``sweep(...).values - baseline``. ``meta["baseline"]`` is the metric of ``trace``
        (when ``metric`` was given here).

    Raises:
        GradUnavailableError: ``grads_not_captured`` (trace without ``save_grads=True``),
            ``backward_not_run`` (no ``metric`` and no backward yet), ``not_saved``.
        InterventionError: ``not_comparable`` when the traces differ.

    Example:
        >>> import torch, torchlens as tl
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 1))
        >>> corrupt = tl.trace(model, torch.randn(1, 4), save_grads=True)
        >>> clean = tl.trace(model, torch.randn(1, 4))
        >>> got = attribution(corrupt, clean, [tl.label("linear_1")], lambda out: out.sum())
        >>> delta = clean["linear_1"].out - corrupt["linear_1"].out  # a linear readout:
        >>> torch.allclose(got.values[0].float(), (delta * model[1].weight).sum())  # exact
        True
    """
    check_comparable(trace, source)
    found = _sites(trace, sites)
    positions, heads = (None if p is None else list(p) for p in (positions, heads))
    meta = {}
    if metric is not None:
        meta["baseline"] = _number(trace.backward(metric))
    dims, coords = _axes(found, positions, heads)
    rows = []
    for _, labels in found:
        total = 0.0
        for lab in labels:
            grad = _grad(trace, lab)
            if grad is None:
                continue
            delta = source[lab].out.detach().double() - trace[lab].out.detach().double()
            total = total + _reduce(delta * grad.double(), positions, heads, seq_dim, head_dim, lab,
                                   n_heads)  # fmt: skip
        rows.append(torch.as_tensor(total, dtype=torch.float64).expand(
            [len(coords[d]) for d in dims[1:]]))  # fmt: skip
    return LabelledTensor(torch.stack(rows), dims, coords, name="attribution", meta=meta)


def _grad(trace: Trace, lab: str) -> torch.Tensor | None:
    try:
        return trace[lab].grad.detach()
    except GradUnavailableError as err:
        if err.code == "no_grad":
            return None  # off the metric's path: no effect to first order
        if err.code == "backward_not_run":
            raise GradUnavailableError(
                f"{err} (pass metric= to attribution, which runs the backward)", code=err.code
            ) from None
        raise


def _reduce(
    c: torch.Tensor,
    positions: Any,
    heads: Any,
    seq_dim: int,
    head_dim: int,
    lab: str,
    n_heads: int | None = None,
) -> torch.Tensor:
    """Sum ``c`` over every axis but the position and head axes, then pick the cells."""
    op = _Named(lab, c.shape)
    check_head_axis(c, op, heads, head_dim, seq_dim, n_heads)
    keep = []
    seq_axis = _axis(c, op, seq_dim, "seq_dim") if positions is not None else None
    if heads is not None and n_heads is not None:  # the last axis split: heads before it
        c = split_heads(c, op, n_heads)
        head_axis = c.dim() - 2
    elif heads is not None:
        head_axis = _axis(c, op, head_dim, "head_dim")
    if positions is not None:
        keep.append((seq_axis, list(positions)))
    if heads is not None:
        keep.append((head_axis, list(heads)))
    if not keep:
        return c.sum()
    if len(keep) == 2 and keep[0][0] == keep[1][0]:
        raise _axis_error(lab, c.shape, "seq_dim and head_dim name the same axis")
    moved = c.movedim([axis for axis, _ in keep], list(range(len(keep))))
    moved = moved.sum(dim=list(range(len(keep), moved.dim())))
    for i, (_, picks) in enumerate(keep):
        size = moved.shape[i]
        if any(not -size <= p < size for p in picks):
            raise _axis_error(lab, c.shape, f"{picks} are not indices of an axis of size {size}")
        index = torch.tensor([p % size for p in picks], device=moved.device)
        moved = moved.index_select(i, index)
    return moved


class _Named:
    """The two fields of an op that the edit helpers' error messages read."""

    def __init__(self, lab: str, shape: Any) -> None:
        self.label, self.shape = lab, shape


def _axis_error(lab: str, shape: Any, why: str) -> InterventionError:
    return InterventionError(
        f"cannot attribute {lab!r} of shape {tuple(shape)}: {why}; pass positions=, "
        "heads=, seq_dim= and head_dim= that fit the site's values",
        code="bad_edit",
    )
