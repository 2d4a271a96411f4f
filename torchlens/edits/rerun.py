"""Post-hoc what-if: edit ops of a finished trace and recompute only what depends on them.

:func:`rerun` walks the trace one recorded call at a time with the replay interpreter. A call
none of whose inputs changed keeps its saved values and costs a set lookup; a call downstream
of an edit is re-executed on the new values (random calls draw the numbers they drew in the
forward). The edits are the ``{selector: fn(t, op)}`` of ``intervene=``, applied where a
live run applies them, so ``trace.rerun(edits)`` gives what ``tl.trace(model, x,
intervene=edits)`` gives, without running the model. :func:`patch` builds the edits that put
another trace's values (a clean run) into this one, after checking the two are comparable.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from torchlens.capture import apply_edit, fill, flatten, parse_intervene
from torchlens.errors import InterventionError, InvalidArgumentError, PayloadUnavailableError
from torchlens.replay import MUTATES_ARGUMENTS, Interpreter, Unreplayable, calls
from torchlens.selectors import as_selector
from torchlens.trace import Trace

__all__ = ["rerun", "patch", "check_comparable"]

Tensor = torch.Tensor


class _Overlay:
    """A payload store: the new values first, then the original trace's."""

    def __init__(self, base: Any, values: dict[str, Tensor]) -> None:
        self.base, self.values = base, values

    def get(self, label: str) -> Tensor:
        value = self.values.get(label)
        return self.base.get(label) if value is None else value

    def has(self, label: str) -> bool:
        return label in self.values or self.base.has(label)


ESCAPE_POLICIES = ("raise", "recorded")


class _WhatIf(Interpreter):
    def __init__(self, trace: Trace, edits: list, escapes: str = "raise") -> None:
        super().__init__(trace)
        self.edits = edits
        self.escapes: dict[str, list[Any]] = {}  # escaped label -> its escapes
        for escape in trace.escapes:
            self.escapes.setdefault(escape.label, []).append(escape)
        self.policy = escapes
        self.replayed: list[Any] = []  # escapes whose recorded Python values were kept
        self.new: dict[str, Tensor] = {}  # label -> value that differs from the saved one
        self.edited: list[str] = []
        self.aliased: dict[str, Any] = {}  # edited ops that returned their argument
        self.unsaved: dict[str, Tensor] = {}  # label -> value save= left out, remade

    def value(self, label: str) -> Tensor:
        new = self.new.get(label)
        if new is None:
            new = self.unsaved.get(label)
        if new is not None:
            return new
        try:
            return self.trace[label].out
        except PayloadUnavailableError as err:
            if err.code == "not_saved" and self._recompute_unsaved(label):
                return self.unsaved[label]
            raise PayloadUnavailableError(
                f"rerun needs the saved value of {label!r}, an input of a recomputed op: {err}; "
                "trace without save= or structure_only= to edit after the fact",
                code=err.code,
            ) from None

    def _recompute_unsaved(self, label: str) -> bool:
        """Make the value of ``label``, which ``save=`` left out and no edit reaches, from
        the saved values upstream of it (a norm's ``1 + weight`` beside the blocks' saved
        outputs): each op between them run once, in order, as the forward ran it. False
        when one of them cannot be (a source, a random call, a refresh) or nothing saved
        is upstream."""
        store, todo, seen, stack = self.trace.store, [], set(), [label]
        while stack:
            name = stack.pop()
            if name in seen or name in self.unsaved or name in self.new or store.has(name):
                continue
            seen.add(name)
            record = self.trace[name]
            func = getattr(record, "func", None)
            if func is None or record.rng_state is not None or record.is_inplace:
                return False
            todo.append(record)
            stack.extend(ref.label for ref in record.parent_args)
        for op in sorted(todo, key=lambda record: record.index):
            values = [self.value(ref.label) for ref in op.parent_args]
            if op.func_name in MUTATES_ARGUMENTS:
                values = [v.clone() for v in values]
            with torch.no_grad():
                outputs = self.execute(op, values)
            self.unsaved[op.label] = outputs[op.output_index]
        return True

    def visit(self, ops: list[Any]) -> None:
        head = ops[0]
        if self.aliased:
            reads = [self._read(ref.label, head) for ref in head.parent_args]
        else:
            reads = [ref.label for ref in head.parent_args]
        dirty = any(label in self.new for label in reads)
        hits = [[(s, e) for s, e in self.edits if s.matches(op)] if op.func is not None else []
                for op in ops]  # fmt: skip
        if not dirty and not any(hits):
            return
        if dirty:
            outputs = self._recompute(head, reads)
        else:
            outputs = [None] * (max(op.output_index for op in ops) + 1)
        for op, op_hits in zip(ops, hits):
            value = outputs[op.output_index] if op.output_index < len(outputs) else None
            changed = value is not None
            if value is None and op_hits:
                value = op.out
            if op_hits:  # the op as the edit sees it: its inputs read as in this run
                seen = _copy(op, store=_Overlay(self.trace.store, self.new))
            for _, edit in op_hits:
                value = apply_edit(edit, value, seen, inplace=False)
            if op_hits:
                self.edited.append(op.label)
                if "returns_argument" in op.meta and op.children:
                    self.aliased[op.label] = op
            if changed or op_hits:
                self.new[op.label] = value
                if op.label in self.escapes:
                    self._escaped(op.label)

    def _escaped(self, label: str) -> None:
        """An edit reached a value Python read in the forward: a live run would have read
        the new one; raise, or (``escapes="recorded"``) note that the old one is kept."""
        escapes = self.escapes[label]
        if self.policy == "recorded":
            self.replayed += escapes
            return
        raise InterventionError(
            f"the edit reaches {label!r}, whose value Python read in the forward "
            f"({escapes[0]}{f' and {len(escapes) - 1} more' if len(escapes) > 1 else ''}): "
            "the ops after it used that Python value, which rerun cannot recompute; run the "
            "model with tl.trace(..., intervene=...), or pass escapes='recorded' to keep "
            "the recorded Python values",
            code="escape_downstream",
        )

    def _read(self, label: str, reader: Any) -> str:
        """The label whose value ``reader`` reads where the trace says ``label``: the
        argument's, when ``label`` is an edited op that returned its argument and
        ``reader`` held that argument rather than the returned value."""
        op = self.aliased.get(label)
        while op is not None and not _reads_returned_value(op, reader):
            label = op.meta["returns_argument"]
            op = self.aliased.get(label)
        return label

    def _recompute(self, op: Any, reads: list[str]) -> list[Tensor]:
        values = [self.value(label) for label in reads]
        if op.is_inplace or op.func_name in MUTATES_ARGUMENTS or op.func is None:
            values = [v.clone() for v in values]  # saved values stay as saved
        try:
            if not torch.is_grad_enabled():  # a sweep runs the whole walk under no_grad
                return self.execute(op, values)
            with torch.no_grad():
                return self.execute(op, values)
        except Unreplayable as err:
            raise InterventionError(
                f"{op.label!r} is downstream of the edit but cannot be recomputed ({err}); "
                "run the model with tl.trace(..., intervene=...) instead",
                code="not_replayable",
            ) from None
        except Exception as err:  # the recorded call does not take the edited values
            raise InterventionError(
                f"{op.label!r} is downstream of the edit, and its recorded call raised "
                f"{type(err).__name__} on the new values ({err}): a shape or an index that "
                "the live forward would have computed from them (a detection head's boxes) "
                "no longer fits; run the model with tl.trace(..., intervene=...) instead",
                code="recompute_failed",
            ) from err


def _reads_returned_value(op: Any, reader: Any) -> bool:
    """Whether ``reader``, which the trace says read ``op`` (an op that returned its
    argument as it was, the same tensor), read the returned value rather than the argument.

    The trace cannot tell the two names apart; the module calls can. A reader inside the
    module call that ran ``op`` holds the returned value (the usual ``x = dropout(x)``). A
    reader outside it got the tensor from that call's return when ``op`` is what the call
    returned (then the same question goes to the enclosing call), and held the argument
    otherwise: a residual kept aside before an ``RMSNorm`` whose ``x.to(float32)`` is
    float32 already.
    """
    inside = set(reader.module_stack)
    returned = {(address, index) for address, index, _ in op.returned_by}
    for frame in reversed(op.module_stack):
        if frame in inside:
            return True
        if frame not in returned:
            return False
    return True


def rerun(trace: Trace, edits: Mapping[Any, Any], *, escapes: str = "raise") -> Trace:
    """A new trace in which the edited ops take new values and only their downstream cone
    is recomputed, from saved values with the recorded calls. ``trace`` is untouched.

    Two things a live run could do differently are replayed as recorded: Python control
    flow on values (``if x.sum() > 0``, ``.item()`` loops), and writes through views (a live
    edit of a view that is later written in place gives a fresh tensor, so the write no
    longer reaches its base; here the recorded write is redone).

    An op that returned its argument as it was (eval ``Dropout``, ``x.contiguous()`` of a
    contiguous ``x``, ``x.to(its dtype)``) can be edited: as in a live run, the edit reaches
    the ops that read the returned value, and ops that held the argument under another
    name read the argument. The trace records one tensor for both names, so which reader
    held which is told from the module calls that enclose the op and what they returned
    (a residual kept before an ``RMSNorm`` reads the argument). A second name kept inside
    the same module call (``r = x; y = x.to(x.dtype); y + r``) counts as the returned
    value, where a live run would read the argument.

    Args:
        trace: a trace with saved values (the default ``tl.trace``), not loaded from disk
            when a recomputed call has no replayable function.
        edits: ``{selector: fn(t, op)}`` as for ``intervene=`` (``torchlens.edits`` helpers
            or ``tl.Intervention``); ``tl.module(...).output`` selectors work too.
        escapes: ``"raise"`` (default): an edit that changes a value Python read in the
            forward (``trace.escapes``: ``.item()``, ``if t.any():``) raises, since the
            ops after it used the old Python value. ``"recorded"``: keep the recorded
            Python values; the result's ``meta["escapes_replayed"]`` lists those escapes
            and a warning says so.

    Returns:
        The what-if :class:`~torchlens.trace.Trace`: same ops and labels, new values where
        they changed, ``output`` rebuilt from them, ``meta["intervened"]`` the edited labels.

    Raises:
        SelectorMatchError: ``no_match`` when an edit's selector matches no op.
        PayloadUnavailableError: when a value the recomputation needs was not saved.
        InterventionError: ``not_replayable`` for a call in the cone that cannot be re-run,
            ``recompute_failed`` for one that raises on the edited values,
            ``escape_downstream`` for an edit reaching an escaped value (named with its
            line);
            the edit function's own errors (``bad_edit``, ``changed_shape``...).

    Example:
        >>> import torch, torchlens as tl
        >>> from torchlens import edits
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
        >>> trace = tl.trace(model, torch.randn(2, 4))
        >>> what_if = trace.rerun({tl.func("relu"): edits.zero()})
        >>> float(what_if.output.abs().sum()), trace["relu_1"].out.shape
        (0.0, torch.Size([2, 3]))
    """
    from torchlens.capture import trace_candidates
    from torchlens.selectors import require_match

    if escapes not in ESCAPE_POLICIES:
        raise InvalidArgumentError(
            f"escapes must be one of {ESCAPE_POLICIES}, got {escapes!r}", code="bad_escapes"
        )
    parsed = parse_intervene(edits)
    walker = _WhatIf(trace, parsed, escapes)
    for ops in calls(trace):
        walker.visit(ops)
    for selector, _ in parsed:
        if not any(selector.matches(op) for op in trace.ops if op.func is not None):
            require_match(selector, "rerun edit", trace_candidates(trace))
    result = _new_trace(trace, walker)
    if walker.replayed:
        result.meta["escapes_replayed"] = [str(e) for e in walker.replayed]
        warnings.warn(
            f"rerun kept the recorded Python values of {len(walker.replayed)} escape(s) the "
            f"edit reaches ({walker.replayed[0]}...): ops after them used the old values, as "
            "escapes='recorded' asks",
            stacklevel=2,
        )
    return result


def rerun_output(trace: Trace, edits: Mapping[Any, Any], flat: Any = None) -> Any:
    """``rerun(trace, edits).output`` without building the what-if trace, for sweeps that
    read only the output (their selectors were checked to match); ``flat`` is
    ``flatten(trace.output)``, computed once for many calls."""
    walker = _WhatIf(trace, parse_intervene(edits))
    with torch.no_grad():
        for ops in calls(trace):
            walker.visit(ops)
    return _output(trace, walker, flat)


def _output(trace: Trace, walker: _WhatIf, flat: Any = None) -> Any:
    leaves, template = flatten(trace.output) if flat is None else flat
    outputs = [walker.new.get(label, t) for label, (_, t) in zip(trace.output_labels, leaves)]
    return fill(template, outputs) if leaves else trace.output


def _new_trace(trace: Trace, walker: _WhatIf) -> Trace:
    """The what-if trace. Ops whose value did not change are the original records, shared
    (finished records are never written); changed ops are copies reading the new values."""
    store = _Overlay(trace.store, walker.new)
    edited = set(walker.edited)
    ops = []
    for op in trace.ops:
        value = walker.new.get(op.label)
        if value is None:
            ops.append(op)
            continue
        meta = {**op.meta, "intervened": True} if op.label in edited else dict(op.meta)
        ops.append(_copy(op, meta=meta, store=store, shape=tuple(value.shape), dtype=value.dtype))
    output = _output(trace, walker)
    meta = {**trace.meta, "intervened": list(walker.edited)}
    meta.pop("interventions", None)
    return Trace(ops, list(trace.sources), list(trace.modules), list(trace.input_labels),
                 list(trace.output_labels), output, store, trace.rng_state, meta,
                 trace.escapes, trace.hidden_edges)  # fmt: skip


def _copy(record: Any, **changes: Any) -> Any:
    """A shallow copy of an op or source with ``changes`` set (cheaper than
    ``dataclasses.replace``, which reruns ``__init__``)."""
    new = copy.copy(record)
    for name, value in changes.items():
        setattr(new, name, value)
    return new


def check_comparable(trace: Trace, other: Trace) -> None:
    """Raise unless ``other`` recorded the same graph as ``trace`` with the same shapes.

    Raises:
        InterventionError: ``not_comparable``, naming the first op that differs.

    Example:
        >>> import torch, torchlens as tl
        >>> model = torch.nn.Linear(4, 3)
        >>> check_comparable(tl.trace(model, torch.randn(2, 4)), tl.trace(model, torch.randn(2, 4)))
    """
    if len(trace.ops) != len(other.ops):
        raise InterventionError(
            f"the traces are not comparable: {len(trace.ops)} ops against {len(other.ops)}; "
            "patch between runs of the same model on inputs of the same shape",
            code="not_comparable",
        )
    for a, b in zip(trace.ops, other.ops):
        if (a.label, a.shape, a.parents) != (b.label, b.shape, b.parents):
            raise InterventionError(
                f"the traces are not comparable at op {a.index}: {a.label!r} {a.shape} "
                f"against {b.label!r} {b.shape}; patch between runs of the same model on "
                "inputs of the same shape",
                code="not_comparable",
            )


def patch(
    trace: Trace,
    source: Trace,
    select: Any,
    *,
    positions: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    head_dim: int = 1,
    seq_dim: int = -2,
    n_heads: int | None = None,
) -> dict[Any, Any]:
    """The edits that put ``source``'s values of the ops ``select`` matches into ``trace``
    (activation patching: ``source`` is the clean run, ``trace`` the corrupted one).

    Args:
        trace: the run to patch into.
        source: a trace of the same model on an input of the same shape, with saved values.
        select: which ops to patch (``tl.label("add_3")``, ``tl.module("h.2").output``...).
        positions: patch only these sequence positions (indices along ``seq_dim``); None
            patches the whole value.
        heads: patch only these heads (indices along ``head_dim``); None patches them all.
        head_dim: the axis that holds the heads (1 for ``(batch, heads, tokens, head_dim)``).
        seq_dim: the axis that holds the positions (-2: the token axis of ``(batch, tokens,
            d)`` and of ``(batch, heads, tokens, head_dim)``).
        n_heads: split the last axis into this many heads for ``heads=`` (a ``(batch,
            tokens, d)`` site such as the attention output projection's input).

    Returns:
        ``{select: fn}`` for :meth:`Trace.rerun` or ``intervene=``.

    Raises:
        InterventionError: ``not_comparable`` when the two traces differ in graph or shapes;
            ``bad_edit`` (when applied) for a position, head or axis out of range, or
            ``heads=`` on the position axis of a site without a head axis.

    Example:
        >>> import torch, torchlens as tl
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
        >>> clean, corrupt = tl.trace(model, torch.randn(2, 4)), tl.trace(model, torch.randn(2, 4))
        >>> patched = corrupt.rerun(patch(corrupt, clean, tl.label("relu_1")))
        >>> torch.equal(patched.output, clean.output)
        True
        >>> row = corrupt.rerun(patch(corrupt, clean, tl.label("relu_1"), positions=[0]))
        >>> torch.equal(row.output[0], clean.output[0])
        True
        >>> torch.equal(row.output[1], corrupt.output[1])
        True
    """
    from torchlens.edits._helpers import resample

    check_comparable(trace, source)
    edit = resample(source, heads=heads, head_dim=head_dim, positions=positions, seq_dim=seq_dim,
                    n_heads=n_heads)  # fmt: skip
    return {as_selector(select): edit}
