"""The data model: a finished :class:`Trace` of :class:`Op` s, :class:`Source` s and module calls.

Everything here is plain data built by ``torchlens.capture`` and read by replay, io and viz.
Payloads (saved activations) live in a :class:`PayloadStore`, not on the records, so a trace
holds no reference cycle and dropping it frees its tensors at once.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from torchlens._escapes import Escape, HiddenEdge
from torchlens._source import SourceLine, source_of
from torchlens._store import MemoryPayloadStore, PayloadStore, Stored
from torchlens._views import (
    SUMMARY_ROWS,
    ModuleCalls,
    OpSequence,
    filter_ops,
    missing_label_message,
    module_types,
    note_returns,
    summary_text,
)
from torchlens.errors import GradUnavailableError, LookupFailedError, PayloadUnavailableError

__all__ = [
    "ArgRef",
    "Escape",
    "HiddenEdge",
    "ModuleCall",
    "Op",
    "PayloadStore",
    "MemoryPayloadStore",
    "Source",
    "Trace",
    "lookup_of",
    "lookup_while",
]


class ArgRef(NamedTuple):
    """One tensor argument of a call: which record fed it and where it went.

    ``position`` is a path into the call's arguments: ``"0"`` is the first positional
    argument, ``"1.2"`` the third element of the second, ``"weight"`` a keyword.
    """

    label: str  # the parent op or source
    position: str  # where in the call's arguments it was passed


class _GradStored(Stored):
    """A record with a gradient store too (its ``_grads``), attached after the forward by
    the backward capture (``save_grads=True``) or by io when it loads saved gradients."""

    __slots__ = ()
    _grads: PayloadStore | None

    @property
    def grad_store(self) -> PayloadStore | None:
        """The store that holds this record's gradient (``grad`` reads it); None when none is."""
        return self._grads

    @grad_store.setter
    def grad_store(self, store: PayloadStore | None) -> None:
        self._grads = store

    @property
    def out(self) -> torch.Tensor:
        """The value this op produced (a source's: when it was first used), as it was then.

        Raises:
            PayloadUnavailableError: with code ``structure_only``, ``not_saved`` or
                ``payload_overwritten`` when no faithful value can be given.
        """
        if self._store is None:
            raise PayloadUnavailableError(
                f"no payload store is attached to {self.label!r}", code="not_saved"
            )
        return self._store.get(self.label)

    @property
    def has_out(self) -> bool:
        """Whether :attr:`out` can be given."""
        return self._store is not None and self._store.has(self.label)

    @property
    def grad(self) -> torch.Tensor:
        """The true gradient of the loss w.r.t. this output (a source's: summed over all its
        uses), after backward capture.

        Raises:
            GradUnavailableError: with code ``grads_not_captured``, ``backward_not_run``,
                ``no_grad``, ``not_saved`` or ``grad_aliased``.
        """
        if self._grads is None:
            raise GradUnavailableError(
                f"no gradients were captured for {self.label!r}; trace with save_grads=True "
                "and run trace.backward() to record them",
                code="grads_not_captured",
            )
        return self._grads.get(self.label)


@dataclass(eq=False)
class Source(_GradStored):
    """A tensor that entered the forward from outside: input, parameter, buffer or constant."""

    label: str  # "input_1", a parameter/buffer address like "0.weight", or "constant_1"
    kind: str  # "input" | "parameter" | "buffer" | "constant"
    path: str  # where it came from: "args[0]", "kwargs['mask']", the address, or "closure"
    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    requires_grad: bool
    children: list[str] = field(default_factory=list)  # labels of ops that consumed it
    _store: PayloadStore | None = field(default=None, repr=False)
    _grads: PayloadStore | None = field(default=None, repr=False)  # set by save_grads=True


@dataclass(eq=False)
class Op(_GradStored):
    """One tensor produced by one function call during the forward pass."""

    label: str  # unique and stable across identical runs, e.g. "linear_2" or "split_1:0"
    index: int  # position in execution order, 0-based
    func_name: str  # "linear", "relu", "add", "getitem", "setitem", ...
    call_index: int  # which function call produced it; outputs of one call share it
    output_index: int  # which output of that call (0 for single-output calls)
    parents: tuple[str, ...]  # labels of the ops/sources it read, first-use order, unique
    parent_args: tuple[ArgRef, ...]  # every tensor argument, in argument order
    module: str  # innermost module address; "" for code of the traced callable itself
    module_stack: tuple[tuple[str, int], ...]  # (address, call number), outermost first
    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    requires_grad: bool
    is_inplace: bool  # the call wrote into an existing tensor (relu_, +=, x[0] = y, out=)
    children: list[str] = field(default_factory=list)  # labels of ops that consumed it
    module_type: str = ""  # class name of the innermost module ("Conv2d"); the root's type at ""
    func: Callable[..., Any] | None = field(default=None, repr=False)  # for replay
    args_template: tuple = field(default=(), repr=False)  # args, tensors as ArgSlot
    kwargs_template: dict = field(default_factory=dict, repr=False)
    rng_state: dict[str, torch.Tensor] | None = field(default=None, repr=False)
    meta: dict[str, Any] = field(default_factory=dict, repr=False)  # free-form annotations
    # module calls that returned this value, as (address, call, module type); from modules
    returned_by: tuple[tuple[str, int, str], ...] = field(default=(), repr=False)
    _store: PayloadStore | None = field(default=None, repr=False)
    _grads: PayloadStore | None = field(default=None, repr=False)  # set by save_grads=True

    @property
    def address(self) -> str:
        """The innermost module call as ``"address:call"``, e.g. ``"layers.0:2"``."""
        if not self.module_stack:
            return ""
        address, call = self.module_stack[-1]
        return f"{address}:{call}"

    @property
    def source(self) -> SourceLine:
        """``(file, line, function)`` of the model's line that made this op.

        Raises:
            PayloadUnavailableError: ``source_not_captured`` unless traced with
                ``tl.trace(..., source=True)``.
        """
        return source_of(self)

    @property
    def layer(self) -> str:
        """The label of this op's layer: the ops that are the same code run again (a loop,
        a module called again) form one layer, named by its first op (see ``docs/loops.md``).

        Raises:
            LookupFailedError: ``not_found`` for an op that belongs to no live trace.
        """
        return _layer_of(self)[0]

    @property
    def pass_index(self) -> int:
        """Which pass of its layer this op is, from 1, in execution order; ``1`` for an op
        that is not repeated. ``trace[f"{op.layer}:{op.pass_index}"]`` is this op."""
        return _layer_of(self)[1]

    def _repr_html_(self) -> str:  # notebooks; viz is imported lazily (it sits above trace)
        from torchlens.viz import op_html

        return op_html(self)


def lookup_of(op: Op) -> Callable[[str], Any] | None:
    """How to find the records ``op``'s labels name: its live trace's ``get`` or, while the
    capture runs an edit on ``op`` (:func:`lookup_while`), the ops recorded so far; None when
    neither (the op of a trace that is gone). For code that reads an op's parents from the
    op alone, such as ``tl.attention_pattern`` inside an ``intervene=`` edit."""
    ref = getattr(op, "_trace_ref", None)
    trace = ref() if ref is not None else None
    return trace.get if trace is not None else getattr(op, "_lookup", None)


@contextmanager
def lookup_while(op: Op, lookup: Callable[[str], Any]) -> Iterator[None]:
    """Run a block with ``lookup`` as ``op``'s :func:`lookup_of`: the capture calls an edit
    before the trace exists, and the edit may read the ops recorded so far."""
    op._lookup = lookup
    try:
        yield
    finally:
        del op._lookup


def _layer_of(op: Op) -> tuple[str, int]:
    ref = getattr(op, "_trace_ref", None)
    trace = ref() if ref is not None else None
    if trace is None:
        raise LookupFailedError(
            f"{op.label!r} belongs to no live trace, so it has no layer; read op.layer "
            "while its Trace exists"
        )
    return trace.layers.of(op.label)


@dataclass(eq=False)
class ModuleCall:
    """One call of one module during the forward, with the records that went in and out."""

    address: str  # "" for the traced model itself
    call_index: int  # 1 for the first call of this module, 2 for the second, ...
    module_type: str  # class name, e.g. "Linear"
    inputs: tuple[str, ...]  # labels of tensors passed to forward
    outputs: tuple[str, ...] = ()  # labels of tensors it returned
    ops: tuple[str, ...] = ()  # labels of ops run inside it, nested calls included

    @property
    def name(self) -> str:
        """``"address:call"``, the way module calls are written in summaries."""
        return f"{self.address or '<root>'}:{self.call_index}"


Record = Op | Source


class Trace(OpSequence):
    """A finished recording of one forward pass.

    Iterating yields ops in execution order; ``trace["linear_2"]`` and ``trace[3]`` look up
    ops (labels of sources work too); ``len(trace)`` counts ops.

    Example:
        >>> import torch, torchlens as tl
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
        >>> [op.func_name for op in tl.trace(model, torch.randn(2, 4))]
        ['linear', 'relu']
    """

    def __init__(
        self,
        ops: list[Op],
        sources: list[Source],
        modules: list[ModuleCall],
        input_labels: list[str],
        output_labels: list[str],
        output: Any,
        store: PayloadStore,
        rng_state: dict[str, Any] | None = None,
        meta: dict[str, Any] | None = None,
        escapes: list[Escape] | None = None,
        hidden_edges: list[HiddenEdge] | None = None,
        status: Any = None,
    ) -> None:
        self.ops = ops
        self.sources = sources
        self.modules = ModuleCalls(modules)  # a list, also indexable by "address[:call]"
        self.input_labels = input_labels
        self.output_labels = output_labels
        self.output = output  # what the model returned (None when the forward was halted)
        self.store = store
        self.rng_state = rng_state
        self.meta: dict[str, Any] = dict(meta or {})
        self.grad_session: Any = None  # set by tl.trace(save_grads=True); runs backward
        # values Python read during the forward (.item(), if t.any(): ...), in order
        self.escapes: list[Escape] = list(escapes or ())
        # dependencies through escapes, proved by validation: an edge kind apart from parents
        self.hidden_edges: list[HiddenEdge] = list(hidden_edges or ())
        # the validation status of this forward (tl.trace(..., validate=True)), else None:
        # a torchlens.replay.ReplayStatus, saved with the trace and shown by show()/draw()
        self.status: Any = status
        self._by_label: dict[str, Record] = {s.label: s for s in sources}
        self._by_label.update({op.label: op for op in ops})
        types = module_types(self.modules)
        ref = weakref.ref(self)  # op.layer finds its trace (layers are grouped on first use)
        for op in ops:
            op._trace_ref = ref
            if not op.module_type:
                op.module_type = types.get(op.module, "")
        self._layers: Any = None
        note_returns(self.modules, self._by_label)

    # -- container protocol (iteration, len and ``in`` from OpSequence) --------------------
    def __getitem__(self, key: int | slice | str) -> Any:
        if isinstance(key, (int, slice)):
            return self.ops[key]
        if isinstance(key, str):
            record = self._by_label.get(key)
            if record is None and ":" in key:
                record = self.layers.find(key)  # "linear_1:2": the second pass of linear_1
            if record is None:
                raise LookupFailedError(missing_label_message(key, self._by_label, self.modules))
            return record
        raise LookupFailedError(
            f"trace keys are labels (str) or positions (int), got {type(key).__name__}",
            code="bad_key",
        )

    def get(self, label: str, default: Any = None) -> Record | Any:
        """The op or source with ``label``, or ``default``."""
        return self._by_label.get(label, default)

    # -- views ----------------------------------------------------------------------------
    @property
    def layers(self) -> Any:
        """Layer label -> its ops in pass order (a :class:`~torchlens.layers.Layers`
        mapping): ops that are the same code run again (a Python loop, a module called
        again, ``generate``'s steps) are one layer, each run a pass. Grouped on first use,
        after capture, in O(ops); ``.repeated`` gives the layers of several passes. The rule
        is in ``docs/loops.md``.

        Example:
            >>> import torch, torchlens as tl
            >>> cell = torch.nn.Linear(4, 4)
            >>> trace = tl.trace(lambda x: cell(cell(x)), torch.ones(1, 4), root=cell)
            >>> trace.layers.repeated, trace["linear_1:2"].label
            ({'linear_1': 2}, 'linear_2')
        """
        if self._layers is None:
            from torchlens.layers import group_layers  # a pass over the finished trace

            self._layers = group_layers(self)
        return self._layers

    @property
    def inputs(self) -> list[Source]:
        """The input sources, in the order the arguments were given."""
        return [self._by_label[label] for label in self.input_labels]

    @property
    def outputs(self) -> list[Record]:
        """The records the model returned, in the order of its flattened output."""
        return [self._by_label[label] for label in self.output_labels]

    @property
    def parameters(self) -> dict[str, Source]:
        """Parameter sources that the forward read, by address."""
        return {s.label: s for s in self.sources if s.kind == "parameter"}

    @property
    def buffers(self) -> dict[str, Source]:
        """Buffer sources that the forward read, by address."""
        return {s.label: s for s in self.sources if s.kind == "buffer"}

    @property
    def structure_only(self) -> bool:
        """Whether the trace was captured without payloads."""
        return bool(self.meta.get("structure_only", False))

    def hidden_parents(self, label: str) -> tuple[str, ...]:
        """The records ``label`` depends on through escapes, as validation proved them
        (:attr:`hidden_edges`); never part of ``op.parents``. See ``docs/validation.md``."""
        return tuple(dict.fromkeys(e.parent for e in self.hidden_edges if e.child == label))

    def hidden_children(self, label: str) -> tuple[str, ...]:
        """The records that depend on ``label`` through escapes (:attr:`hidden_edges`)."""
        return tuple(dict.fromkeys(e.child for e in self.hidden_edges if e.parent == label))

    # -- gradients (filled by backward capture, torchlens.capture.grads) --------------------
    @property
    def grads(self) -> Mapping[str, torch.Tensor]:
        """Captured gradients by label (ops and sources, e.g. ``"0.weight"``)."""
        return self._grads_session().grads

    def backward(
        self, loss_fn: Callable[[Any], torch.Tensor] | None = None, *, retain_graph: bool = False
    ) -> torch.Tensor:
        """Run backward through the captured forward, filling ``op.grad`` for every op.

        Args:
            loss_fn: maps ``trace.output`` to a scalar loss; by default the sum of the sums
                of all floating outputs.
            retain_graph: keep the autograd graph for another backward, as in PyTorch.

        Returns:
            The loss that was backpropagated.
        """
        return self._grads_session().backward(self.output, loss_fn, retain_graph=retain_graph)

    def _grads_session(self) -> Any:
        if self.grad_session is None:
            raise GradUnavailableError(
                "this trace was captured without save_grads=True, so it holds no live "
                "autograd graph; trace again with tl.trace(..., save_grads=True)",
                code="grads_not_captured",
            )
        return self.grad_session

    def save(self, path: Any) -> Any:
        """Write this trace to the directory ``path``; same as ``tl.save(trace, path)``.

        Returns the directory as a :class:`~pathlib.Path`; see :func:`torchlens.io.save`.
        """
        from torchlens.io import save  # lazy: the data model does not depend on io

        return save(self, path)

    def rerun(self, edits: Mapping[Any, Any], *, escapes: str = "raise") -> Trace:
        """A what-if trace: ``edits`` (``{selector: fn(t, op)}``, as for ``intervene=``)
        applied to this trace's saved values, recomputing only the ops downstream of them;
        this trace is untouched. An edit reaching an escaped value raises unless
        ``escapes="recorded"``. See :func:`torchlens.edits.rerun`.
        """
        from torchlens.edits import rerun  # lazy: edits sits above the data model

        return rerun(self, edits, escapes=escapes)

    def module_calls(self, pattern: str) -> list[ModuleCall]:
        """Every call of the modules matching ``pattern``, in call order.

        Args:
            pattern: an address (``"layers.0"``), a glob as :func:`tl.module
                <torchlens.selectors.module>` takes (``"layers.*"``: every module below
                ``layers``, as ``*`` crosses dots; ``"layers.+"``: its direct children
                only), or one call (``"layers.0:2"``).

        Returns:
            The :class:`ModuleCall` s, with their inputs, outputs and ops.

        Raises:
            LookupFailedError: ``not_found`` when no call matches; close addresses are named.

        Example:
            >>> import torch, torchlens as tl
            >>> model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
            >>> [m.name for m in tl.trace(model, torch.randn(2, 4)).module_calls("*")]
            ['0:1', '1:1']
        """
        return self.modules.matching(pattern)

    # -- printing -------------------------------------------------------------------------
    def summary(
        self,
        select: Any = None,
        *,
        module: str | None = None,
        max_rows: int | None = SUMMARY_ROWS,
        by: str = "op",
    ) -> str:
        """A table of ops: label, function, module call, shape, dtype.

        Args:
            select: a selector (``tl.func("conv2d")``, ``tl.where(...)``): only matching ops.
            module: only ops inside this module (an address or glob, as ``tl.module``).
            max_rows: past this many rows only the first and last rows are shown, with a
                count of the rest; ``None`` shows every row.
            by: ``"op"``, or ``"module"`` for one row per module call with shapes,
                parameters, FLOPs and output bytes (``tl.summary(trace)`` returns it as an
                object; see ``docs/debugging.md``); ``module=`` then picks the calls shown.

        Returns:
            The table as text; ``print(trace)`` prints ``trace.summary()``.

        Raises:
            InvalidArgumentError: ``bad_selector`` for something that is not a selector;
                ``bad_summary`` for another ``by`` or a selector with ``by="module"``.

        Example:
            >>> import torch, torchlens as tl
            >>> model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
            >>> text = tl.trace(model, torch.randn(2, 4)).summary(tl.func("relu"))
            >>> "relu_1" in text and "linear_1" not in text
            True
        """
        if by != "op":  # the debug workflow sits above the data model: imported lazily
            from torchlens.debug import summary_by

            return summary_by(self, by, select, module, max_rows)
        ops, notes = filter_ops(self.ops, select, module)
        return summary_text(self, ops, max_rows, notes)

    def __str__(self) -> str:
        return self.summary()

    def __repr__(self) -> str:
        return (
            f"<Trace: {len(self.ops)} ops, {len(self.sources)} sources, "
            f"{len(self.modules)} module calls>"
        )

    def _repr_html_(self) -> str:  # notebooks; viz is imported lazily (it sits above trace)
        from torchlens.viz import trace_html

        return trace_html(self)

    # -- drawing (torchlens.viz, imported lazily: it sits above this module) --------------
    def to_dot(
        self, depth: int | None = None, collapse_repeats: bool = False, **options: Any
    ) -> str:
        """The graph as Graphviz DOT text; see :func:`torchlens.viz.to_dot`."""
        from torchlens.viz import to_dot

        return to_dot(self, depth=depth, collapse_repeats=collapse_repeats, **options)

    def draw(
        self,
        path: Any,
        depth: int | str | None = "auto",
        collapse_repeats: bool = False,
        **options: Any,
    ) -> Any:
        """Draw the graph to an .svg, .png or .pdf file; see :func:`torchlens.viz.draw`.

        With the default ``depth="auto"``, a graph of more than ``max_nodes=150`` boxes or
        more than 40 boxes tall is folded to a readable size, with a warning saying so;
        ``depth=None`` (or ``max_nodes=None``) draws every op, an int draws to that depth.
        ``rolled=True`` draws each layer (:attr:`layers`) once with its pass count, the
        edges between passes labelled (``docs/loops.md``).
        """
        from torchlens.viz import draw

        return draw(self, path, depth=depth, collapse_repeats=collapse_repeats, **options)

    def show(
        self,
        path: Any = None,
        *,
        status: Any = None,
        open: bool = False,
        values: int = 0,
        rolled: bool = False,
    ) -> Any:
        """Write an interactive HTML page of the graph; see :func:`torchlens.viz.show`.

        Module calls unfold on click, a search box finds ops, clicking an op shows its
        fields and value statistics; ``status=tl.replay(...)`` colours ops by verdict
        (by default :attr:`status`, the one ``tl.trace(..., validate=True)`` kept).
        ``rolled=True`` opens the rolled view (each layer once; a button switches back).
        Returns a :class:`~torchlens.viz.ViewerPage` (its ``.path``; inline in notebooks).
        """
        from torchlens.viz import show

        status = self.status if status is None else status
        return show(self, path, status=status, open=open, values=values, rolled=rolled)
