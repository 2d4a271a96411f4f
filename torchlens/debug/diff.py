"""``tl.diff``: where two runs of a model part ways.

Ops are matched through the graph: an op pairs with the op of the other run that applies the
same function to the partners of its parents, preferring the one with its own label, so an
extra call in one run (which shifts every later label of that function) moves no later
match. What is left pairs by position in the sequence of function names
(:class:`difflib.SequenceMatcher`). Each matched pair's values are compared under the
replay tolerance table (:mod:`torchlens.replay.tolerances`), taking the looser entry of the
two dtypes, so a float32 run and a bfloat16 run are judged at bfloat16's tolerance. Ops
whose values are uninitialized memory (``torch.empty``, ``new_empty``, ``x.new(2, 3)``: the
calls replay exempts from value checks) are not compared, only their shapes.

Ops without parents (``torch.tensor(2.0)``, ``arange``) pair only with an op of the same
call, non-tensor arguments included: one extra constant early in a run (a module caching a
value on its first call) then leaves the later constants paired as they should be.
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from torchlens._table import dataframe, format_table
from torchlens._views import dtype_text
from torchlens.debug._measure import DIFFERS, compare_norms, compare_values
from torchlens.io import load
from torchlens.replay import GROWS_TARGET, TOLERANCES, value_exempt
from torchlens.trace import Op, Trace

__all__ = ["OpDiff", "TraceDiff", "compare_values", "diff"]

SHAPE, NO_VALUE = "shape", "no value"
UNINITIALIZED = "uninitialized"


@dataclass(frozen=True)
class OpDiff:
    """One matched pair of ops and how their values compare."""

    label_a: str
    label_b: str
    func_name: str
    module_call: str  # the innermost module call in run A ("layers.0:1"), "" for the root
    shape_a: tuple[int, ...]
    shape_b: tuple[int, ...]
    dtype_a: str
    dtype_b: str
    max_abs: float | None  # largest |a - b| (inf where only one side is NaN)
    max_rel: float | None  # largest |a - b| / max(|a|, |b|) (0 where both are 0)
    # "same", "differs" (rel_error beyond tolerance), "shape" (shapes differ), "no value"
    # (not compared: not kept) or "uninitialized" (not compared: uninitialized memory)
    status: str
    matched_by: str  # "label" (same label in both runs) or "position" (relabelled)
    rel_error: float | None = None  # ||a - b|| / ||a|| (run A the reference; inf for NaN
    # or infinity against a finite value); what "differs" is judged by
    cosine: float | None = None  # cosine similarity of a and b (1.0 when both are zero)


class TraceDiff:
    """The comparison of two runs; ``print`` it, or read its fields.

    Attributes:
        rows: an :class:`OpDiff` per matched pair, in run A's execution order.
        only_in_a: labels of run A's ops with no partner in run B (and ``only_in_b``).
        tolerance: ``(atol, rtol)`` overrides given to :func:`diff` (``None``: the table).
    """

    def __init__(
        self, rows: list[OpDiff], only_in_a: list[str], only_in_b: list[str], tol: tuple
    ) -> None:
        self.rows = rows
        self.only_in_a = only_in_a
        self.only_in_b = only_in_b
        self.tolerance = tol

    @property
    def first_divergence(self) -> OpDiff | None:
        """The first op (run A's order) whose shapes differ or whose error relative to its
        norm is beyond tolerance; ``None`` if none."""
        return next((r for r in self.rows if r.status in (DIFFERS, SHAPE)), None)

    @property
    def diverged(self) -> list[OpDiff]:
        """Every pair whose values or shapes differ."""
        return [r for r in self.rows if r.status in (DIFFERS, SHAPE)]

    @property
    def unverified(self) -> list[OpDiff]:
        """Pairs that could not be compared (a value was not saved)."""
        return [r for r in self.rows if r.status == NO_VALUE]

    @property
    def same(self) -> bool:
        """True when every op matched, every value was compared (uninitialized memory
        aside: only its shape is), and none differ."""
        return not (self.diverged or self.unverified or self.only_in_a or self.only_in_b)

    def __getitem__(self, label: str) -> OpDiff:
        """The pair whose run-A label is ``label``."""
        for row in self.rows:
            if row.label_a == label:
                return row
        raise KeyError(f"{label!r} has no partner in run B (or is not in run A)")

    def to_dicts(self) -> list[dict[str, Any]]:
        """The rows as plain dicts."""
        return [asdict(row) for row in self.rows]

    def to_pandas(self) -> Any:
        """The rows as a ``pandas.DataFrame``.

        Raises:
            MissingDependencyError: ``pandas_missing`` when pandas is not installed.
        """
        return dataframe(self.to_dicts(), "diff.to_dicts()")

    def headline(self) -> str:
        """One paragraph: counts, how the relative error grows, the first divergence, ops
        present in one run only."""
        n_pos = sum(r.matched_by == "position" for r in self.rows)
        lines = [
            f"diff: {len(self.rows)} ops matched ({n_pos} by position), "
            f"{len(self.diverged)} differ (||a - b|| / ||a|| beyond tolerance), "
            f"{len(self.unverified)} without values to compare"
        ]
        growth = self.growth()
        if growth:
            lines.append(growth)
        first = self.first_divergence
        if first is None:
            lines.append("no divergence: every compared value is within tolerance")
        else:
            where = f" in {first.module_call}" if first.module_call else ""
            what = (
                f"shape {first.shape_a} vs {first.shape_b}"
                if first.status == SHAPE
                else f"relative error {first.rel_error:.3g}, cosine {first.cosine:.6g}, "
                f"max abs diff {first.max_abs:.3g}"
            )
            lines.append(f"first divergence: {first.label_a} ({first.func_name}){where}: {what}")
        for name, labels in (("A", self.only_in_a), ("B", self.only_in_b)):
            if labels:
                shown = ", ".join(labels[:10]) + (" ..." if len(labels) > 10 else "")
                lines.append(f"only in run {name} ({len(labels)}): {shown}")
        return "\n".join(lines)

    def growth(self) -> str:
        """How ``rel_error`` grows along run A's order: at the first op that differs at all,
        its median, its largest (where) and at the last op; "" when nothing differs."""
        errors = [r for r in self.rows if r.rel_error is not None and r.rel_error > 0]
        if not errors:
            return ""
        values = sorted(r.rel_error for r in errors)
        top = max(errors, key=lambda r: r.rel_error)
        return (
            f"relative error ||a - b|| / ||a||: {errors[0].rel_error:.3g} at "
            f"{errors[0].label_a} (first), median {values[len(values) // 2]:.3g}, largest "
            f"{top.rel_error:.3g} at {top.label_a}, {errors[-1].rel_error:.3g} at "
            f"{errors[-1].label_a} (last)"
        )

    def table(self, max_rows: int | None = 40, only_diverged: bool = False) -> str:
        """The per-op table (head and tail past ``max_rows``; ``None`` shows all)."""
        rows = self.diverged if only_diverged else self.rows
        cells = [_cells(r) for r in rows]
        if max_rows is not None and len(cells) > max_rows:
            head = max(max_rows // 2, 1)
            gap = ("...", f"{len(cells) - max_rows} more", *[""] * 8)
            cells = [*cells[:head], gap, *cells[len(cells) - (max_rows - head) :]]
        header = ("op A", "op B", "function", "shape", "dtype", "rel error", "cosine", "max abs",
                  "max rel", "status")  # fmt: skip
        return format_table(header, cells)

    def __str__(self) -> str:
        return self.headline() + "\n" + self.table()

    def __repr__(self) -> str:
        return f"<TraceDiff: {len(self.rows)} matched, {len(self.diverged)} differ>"


def diff(
    a: Trace | str | os.PathLike,
    b: Trace | str | os.PathLike,
    *,
    atol: float | None = None,
    rtol: float | None = None,
) -> TraceDiff:
    """Compare two runs op by op and find where they diverge.

    Args:
        a: a trace, or a directory written by ``tl.save``.
        b: the other run (a trace or a directory).
        atol: absolute tolerance for floating values (default: the replay table's, per dtype).
        rtol: relative tolerance for floating values (idem). Integers compare exactly.

    Returns:
        A :class:`TraceDiff`: ``first_divergence``, ``rows`` (per pair: ``rel_error``
        ``||a - b|| / ||a||``, which judges it, ``cosine``, max abs/rel difference, shapes,
        dtypes), ``only_in_a``/``only_in_b``; ``print`` it for a report.

    Raises:
        TraceFileError: when a path holds no readable trace.

    Example:
        >>> import torch, torchlens as tl
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
        >>> x = torch.randn(2, 4)
        >>> tl.diff(tl.trace(model, x), tl.trace(model, x)).first_divergence is None
        True
        >>> tl.diff(tl.trace(model, x), tl.trace(model, x + 1)).first_divergence.label_a
        'linear_1'
    """
    trace_a, trace_b = (t if isinstance(t, Trace) else load(t) for t in (a, b))
    pairs, only_a, only_b = match_ops(trace_a.ops, trace_b.ops)
    judged = _judging_dtypes(trace_a, trace_b, pairs)
    rows = [
        _compare(x, y, how, atol, rtol, _uninitialized(trace_a, x), judged[x.label])
        for x, y, how in pairs
    ]
    return TraceDiff(rows, only_a, only_b, (atol, rtol))


def _judging_dtypes(trace_a: Trace, trace_b: Trace, pairs: list) -> dict[str, torch.dtype]:
    """Per run-A label, the dtype whose tolerance judges the pair: the loosest of its own
    two dtypes and, for floating values, of everything upstream of it in either run (a
    float32 op fed by a bfloat16 value carries bfloat16's rounding)."""
    sources = {s.label: s.dtype for t in (trace_a, trace_b) for s in t.sources}
    judged: dict[str, torch.dtype] = {}
    for x, y, _ in pairs:
        dtypes = [x.dtype, y.dtype]
        if x.dtype.is_floating_point or x.dtype.is_complex:
            dtypes += [judged[p] for p in x.parents if p in judged]
            dtypes += [sources[p] for p in (*x.parents, *y.parents) if p in sources]
        judged[x.label] = max(dtypes, key=lambda d: TOLERANCES.get(d, (0.0, 0.0)))
    return judged


def match_ops(
    a: Sequence[Op], b: Sequence[Op]
) -> tuple[list[tuple[Op, Op, str]], list[str], list[str]]:
    """Pairs ``(op_a, op_b, "label" | "position")`` in ``a``'s order, and the labels left
    unmatched in ``a`` and in ``b``.

    An op of ``a`` pairs with the op of ``b`` that runs the same function on the partners
    of its parents (sources pair by label), the one with its own label first; an op
    without parents needs the same non-tensor arguments too, and an op with a parent left
    unpaired pairs no other way than the rest: by position in the sequence of function
    names.
    """
    by_key: dict[tuple, list[Op]] = {}
    for op in b:
        by_key.setdefault(_key(op, op.parents), []).append(op)
    partner: dict[str, str] = {}  # a label -> b label
    pairs: dict[int, tuple[Op, Op, str]] = {}
    used: set[str] = set()
    ops_a = {op.label for op in a}
    for i, op in enumerate(a):
        # a parent op without a partner (run A's first call of a module that caches what
        # it computed) has no counterpart for a child to share: that child pairs below
        if any(p in ops_a and p not in partner for p in op.parents):
            continue
        parents = tuple(partner.get(p, p) for p in op.parents)
        free = [c for c in by_key.get(_key(op, parents), ()) if c.label not in used]
        if free:
            other = next((c for c in free if c.label == op.label), free[0])
            pairs[i] = (op, other, "label" if other.label == op.label else "position")
            partner[op.label] = other.label
            used.add(other.label)
    rest_a = [(i, op) for i, op in enumerate(a) if i not in pairs]
    rest_b = [op for op in b if op.label not in used]
    matcher = difflib.SequenceMatcher(
        None, [op.func_name for _, op in rest_a], [op.func_name for op in rest_b], autojunk=False
    )
    for block in matcher.get_matching_blocks():
        for k in range(block.size):
            i, op = rest_a[block.a + k]
            other = rest_b[block.b + k]
            pairs[i] = (op, other, "label" if other.label == op.label else "position")
            used.add(other.label)
    ordered = [pairs[i] for i in sorted(pairs)]
    only_a = [op.label for i, op in enumerate(a) if i not in pairs]
    only_b = [op.label for op in b if op.label not in used]
    return ordered, only_a, only_b


def _key(op: Op, parents: tuple[str, ...]) -> tuple:
    """What an op must share with its partner: the function, the output, the partners of
    its parents, and for an op without parents its non-tensor arguments."""
    if parents:
        return op.func_name, op.output_index, parents
    return op.func_name, op.output_index, (), repr((op.args_template, op.kwargs_template))


def _uninitialized(trace: Trace, op: Op) -> bool:
    """Whether ``op``'s values are uninitialized memory (see ``value_exempt``)."""
    if op.func_name not in GROWS_TARGET:
        return value_exempt(op, [], None)
    target = trace[op.parents[0]] if op.parents else None
    return target is not None and math.prod(op.shape) > math.prod(target.shape)


def _compare(
    x: Op,
    y: Op,
    how: str,
    atol: float | None,
    rtol: float | None,
    uninitialized: bool,
    judged: torch.dtype,
) -> OpDiff:
    status, max_abs, max_rel, rel_error, cosine = NO_VALUE, None, None, None, None
    if tuple(x.shape) != tuple(y.shape):
        status = SHAPE
    elif uninitialized:
        status = UNINITIALIZED
    elif x.has_out and y.has_out:
        status, max_abs, max_rel, rel_error, cosine = compare_norms(
            x.out, y.out, atol, rtol, judged
        )
    return OpDiff(
        x.label, y.label, x.func_name, x.address, tuple(x.shape), tuple(y.shape),
        dtype_text(x.dtype), dtype_text(y.dtype), max_abs, max_rel, status, how, rel_error, cosine,
    )  # fmt: skip


def _cells(r: OpDiff) -> tuple[str, ...]:
    shape = str(r.shape_a) if r.shape_a == r.shape_b else f"{r.shape_a} vs {r.shape_b}"
    dtype = r.dtype_a if r.dtype_a == r.dtype_b else f"{r.dtype_a} vs {r.dtype_b}"
    label_b = "=" if r.label_b == r.label_a else r.label_b
    nums = [
        "-" if v is None else f"{v:.{6 if name == 'cosine' else 3}g}"
        for name, v in (("", r.rel_error), ("cosine", r.cosine), ("", r.max_abs), ("", r.max_rel))
    ]
    return (r.label_a, label_b, r.func_name, shape, dtype, *nums, r.status)
