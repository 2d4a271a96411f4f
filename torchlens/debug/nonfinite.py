"""``tl.find_nonfinite``: the first op whose output holds a NaN or an infinity.

On a model, one lean pass runs (``tl.record``'s, see :mod:`torchlens.debug._nonfinite_pass`):
each op is counted as a trace counts it and each floating output is checked with one sum; at
the first output that is not finite the call's arguments, still live, give its parents'
values, the module stack its module call and the Python stack the model's line, and the
forward halts there (nothing after it runs). On a trace already captured, its saved values
are scanned in execution order. Either way the report gives the op, its parents' values with
summary statistics (a parent that is already non-finite says the problem came from further
up, an input or a parameter), the module call and the source line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from torchlens._source import SourceLine
from torchlens.capture import (
    Halt,
    check_traceable,
    flatten,
    named_modules,
    normalize_call,
    recording_session,
    restore_buffers,
    rng,
    snapshot_buffers,
)
from torchlens.debug._nonfinite_pass import CulpritOp, NonFiniteMode, is_nonfinite
from torchlens.errors import InvalidArgumentError
from torchlens.recording import Recording
from torchlens.replay import comparable
from torchlens.trace import Op, Trace

__all__ = ["NonFiniteReport", "ValueStats", "find_nonfinite", "is_nonfinite"]


@dataclass(frozen=True)
class ValueStats:
    """Summary statistics of one value; ``min``/``max``/``mean`` are over its finite
    elements (``None`` when it has none, or is not a number type)."""

    label: str
    shape: tuple[int, ...]
    dtype: str
    nan: int  # number of NaN elements
    posinf: int  # number of +inf elements
    neginf: int  # number of -inf elements
    min: float | None
    max: float | None
    mean: float | None

    @property
    def finite(self) -> bool:
        """Whether every element is finite."""
        return not (self.nan or self.posinf or self.neginf)

    def __str__(self) -> str:
        bad = f"nan={self.nan} +inf={self.posinf} -inf={self.neginf}"
        span = "no finite values" if self.min is None else (
            f"min={self.min:.4g} max={self.max:.4g} mean={self.mean:.4g}"
        )  # fmt: skip
        return f"{self.label}: {self.dtype}{list(self.shape)} {bad}; {span}"


def value_stats(label: str, value: torch.Tensor) -> ValueStats:
    """:class:`ValueStats` of ``value``."""
    v = comparable(value).detach().cpu()
    dtype = str(value.dtype).removeprefix("torch.")
    if v.dtype == torch.bool:
        v = v.to(torch.uint8)
    v = v.double()
    nan, posinf, neginf = int(v.isnan().sum()), int(v.isposinf().sum()), int(v.isneginf().sum())
    finite = v[v.isfinite()]
    stats = (None, None, None)
    if finite.numel():
        stats = (float(finite.min()), float(finite.max()), float(finite.mean()))
    return ValueStats(label, tuple(value.shape), dtype, nan, posinf, neginf, *stats)


class NonFiniteReport:
    """What :func:`find_nonfinite` found; true when an op was found.

    Attributes:
        op: the first op with a non-finite output (``None`` when none was found): an
            :class:`~torchlens.trace.Op` of the trace scanned, or, for a model, a
            :class:`~torchlens.debug._nonfinite_pass.CulpritOp` (``label``, ``func_name``,
            ``index``, ``module``, ``address``, ``parents``, ``out``, ``source``).
        stats: :class:`ValueStats` of its output.
        parents: ``{label: ValueStats}`` of each parent whose value is available.
        parent_values: ``{label: tensor}``, the parents' values themselves.
        module_call: the innermost module call, ``"layers.0:1"`` (``""``: the root).
        source: the model line that made it (a :class:`~torchlens._source.SourceLine`),
            or ``None`` when not recorded.
        trace: the trace scanned; for a model, the lean pass's
            :class:`~torchlens.recording.Recording`: the culprit alone (``halted`` set), or
            nothing kept and the model's ``output`` when every value was finite.
        checked: how many op values were checked.
    """

    def __init__(
        self,
        trace: Trace | Recording | None,
        op: Op | CulpritOp | None,
        checked: int,
        inf: bool = True,
        parent_values: dict[str, torch.Tensor] | None = None,
    ) -> None:
        self.trace, self.op, self.checked = trace, op, checked
        self.looked_for = "NaN or Inf" if inf else "NaN"
        self.stats = value_stats(op.label, op.out) if op is not None else None
        if parent_values is None:  # a trace's op: its parents' saved values
            parent_values = {}
            if isinstance(op, Op) and isinstance(trace, Trace):
                parent_values = {p: trace[p].out for p in op.parents if trace[p].has_out}
        self.parent_values: dict[str, torch.Tensor] = parent_values
        self.parents = {k: value_stats(k, v) for k, v in self.parent_values.items()}
        self.module_call = op.address if op is not None else ""
        self.source = _source(op)

    @property
    def found(self) -> bool:
        """Whether a non-finite op was found."""
        return self.op is not None

    def __bool__(self) -> bool:
        return self.found

    def __str__(self) -> str:
        if self.op is None:
            return f"no {self.looked_for}: none in the {self.checked} op outputs checked"
        op = self.op
        lines = [f"first output with a {self.looked_for}: {op.label} ({op.func_name})"]
        lines.append(f"  module call: {self.module_call or '<root> (the traced model itself)'}")
        where_ = str(self.source) if self.source else "not recorded (trace with source=True)"
        lines.append(f"  source: {where_}")
        lines.append(f"  output {self.stats}")
        for stats in self.parents.values():
            mark = "  <- already non-finite" if not stats.finite else ""
            lines.append(f"  parent {stats}{mark}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<NonFiniteReport: {self.op.label if self.op else 'nothing found'}>"


def find_nonfinite(
    target: Any, args: Any = (), kwargs: Mapping[str, Any] | None = None, *, inf: bool = True
) -> NonFiniteReport:
    """Find the first op whose output holds a NaN or an infinity.

    On a model, labels, ``op.index`` and ``checked`` are those of ``tl.trace`` (a value
    changed in place through another view of it is the ``refresh`` op a trace records);
    one exception, rare: tensors that are neither made by ops nor inputs, parameters or
    buffers are numbered ``constant_1``, ... among the culprit's parents alone.

    Args:
        target: a model (run once, as lean as ``tl.record``, halting right after the
            culprit) or a trace already captured (its saved values are scanned).
        args: the model's positional arguments (ignored for a trace).
        kwargs: the model's keyword arguments (ignored for a trace).
        inf: also stop at infinities; pass ``False`` to look for NaN only, in models that
            use ``-inf`` on purpose (attention masks filled with ``-inf``).

    Returns:
        A :class:`NonFiniteReport`, false when nothing was found; ``print`` it.

    Raises:
        InvalidArgumentError: ``no_values`` for a ``structure_only`` trace.
        Whatever the model raises, unchanged, and what :func:`torchlens.record` refuses.

    Example:
        >>> import torch, torchlens as tl
        >>> report = tl.find_nonfinite(lambda x: torch.log(x).exp(), torch.tensor([1.0, -1.0]))
        >>> report.op.label, report.parents["input_1"].min
        ('log_1', -1.0)
    """
    if isinstance(target, Trace):
        return _scan(target, inf)
    modules = named_modules(target) if isinstance(target, nn.Module) else None
    check_traceable(target, modules)
    args, kwargs = normalize_call(args, kwargs, target)
    mode = _run(NonFiniteMode(target, args, kwargs, inf, modules=modules))
    culprit = mode.culprit
    if culprit is not None and culprit.needs_copy:  # made in place: its target's old value
        first = culprit.op.index - culprit.op.output_index
        again = _run(NonFiniteMode(target, args, kwargs, inf, copy_at=first, modules=modules))
        if again.culprit is not None and again.culprit.op.label == culprit.op.label:
            mode, culprit = again, again.culprit  # else the forward is not repeatable
    meta = {"n_ops": mode.n_ops, "halted": culprit is not None, "halted_at": mode.halted_at}
    if culprit is None:
        recording = Recording([], mode.store, mode.call.output, meta)
        return NonFiniteReport(recording, None, mode.n_ops, inf)
    op = culprit.op
    recording = Recording([op], op.store, None, {**meta, "n_ops": op.index + 1})
    return NonFiniteReport(recording, op, op.index + 1, inf, culprit.parent_values)


def _run(mode: NonFiniteMode) -> NonFiniteMode:
    """Run the model under ``mode``; a halt puts its buffers and the RNG state back, as
    ``stop_after=`` does (:meth:`~torchlens.capture.controls.Controls.halting`), the
    buffers found from the modules walked once for the whole call. (The recording pauses
    Python's cyclic garbage collector, as every capture does.)
    """
    state = rng.snapshot()
    call = mode.call
    buffers = snapshot_buffers(module for _, module in call.modules or ())
    mode.add_inputs(call.args, call.kwargs)
    try:
        with recording_session(call.model, mode, call.modules):
            call.output = call.model(*call.args, **call.kwargs)
        mode.read([t for _, t in flatten(call.output)[0]])  # as a trace's end reads them
    except Halt:
        rng.restore(state)
        restore_buffers(buffers)
    return mode


def _scan(trace: Trace, inf: bool) -> NonFiniteReport:
    if trace.structure_only:
        raise InvalidArgumentError(
            "this trace was captured with structure_only=True and holds no values to check; "
            "pass the model instead (tl.find_nonfinite(model, x)) or trace it with values",
            code="no_values",
        )
    checked = 0
    for op in trace.ops:
        if op.has_out:
            checked += 1
            if is_nonfinite(op.out, inf):
                return NonFiniteReport(trace, op, checked, inf)
    return NonFiniteReport(trace, None, checked, inf)


def _source(op: Op | CulpritOp | None) -> SourceLine | None:
    if op is None or (isinstance(op, Op) and "source" not in op.meta):
        return None
    return op.source
