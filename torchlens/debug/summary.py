"""A module summary, as torchinfo prints it: one row per module call, with totals.

Each row gives the call's input and output shapes, the parameters of the module (trainable
and frozen, buffers apart), the FLOPs of the ops run inside it (from
:mod:`torchlens.debug.flops`; ops without a formula are counted as unknown, never as zero)
and the bytes of what it returned. Everything is read from the trace's metadata, so a
``structure_only=True`` trace summarises as well as a full one.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from torch import nn

from torchlens._table import dataframe, format_table
from torchlens._views import shape_text
from torchlens.capture import trace as _trace
from torchlens.debug.flops import op_flops
from torchlens.errors import InvalidArgumentError
from torchlens.trace import Trace

__all__ = ["ModuleRow", "ModuleSummary", "summary", "module_summary"]

_HEADER = (
    "module call", "type", "inputs", "outputs", "params", "frozen", "buffers", "FLOPs",
    "unknown ops", "output bytes",
)  # fmt: skip


@dataclass(frozen=True)
class ModuleRow:
    """One module call of the summary."""

    name: str  # "layers.0:1"; "<root>:1" for the traced model
    module_type: str  # class name, e.g. "Linear"
    depth: int  # 0 for the root, 1 for the calls in it, ...: called modules only (a
    # ModuleList that is never called itself adds no level)
    input_shapes: tuple[tuple[int, ...], ...]
    output_shapes: tuple[tuple[int, ...], ...]
    params: int  # trainable parameter elements the module owns (its submodules included)
    frozen: int  # parameter elements with requires_grad=False
    buffers: int  # buffer elements
    flops: int  # FLOPs of the ops inside with a known formula
    unknown_ops: int  # ops inside whose cost no formula gives
    output_bytes: int  # bytes of the tensors the call returned


class ModuleSummary:
    """A table of module calls; ``print`` it, show it in a notebook, or ``to_pandas()``.

    Attributes:
        rows: the :class:`ModuleRow` s, in call order (the root first).
        totals: ``params``, ``frozen``, ``buffers`` (each parameter counted once),
            ``flops``, ``macs``, ``unknown_ops`` over all ops, and ``activation_bytes``,
            the bytes of every op's output.
    """

    def __init__(self, rows: list[ModuleRow], totals: Mapping[str, int]) -> None:
        self.rows = rows
        self.totals = dict(totals)

    def __getitem__(self, name: str) -> ModuleRow:
        """The row of one call, by ``"address:call"`` (``"<root>:1"`` for the root)."""
        for row in self.rows:
            if row.name == name:
                return row
        raise KeyError(f"no module call {name!r}; calls: {[r.name for r in self.rows][:8]}")

    def to_dicts(self) -> list[dict[str, Any]]:
        """The rows as plain dicts."""
        return [asdict(row) for row in self.rows]

    def to_pandas(self) -> Any:
        """The rows as a ``pandas.DataFrame``.

        Raises:
            MissingDependencyError: ``pandas_missing`` when pandas is not installed.
        """
        return dataframe(self.to_dicts(), "summary.to_dicts()")

    def _cells(self) -> list[tuple[str, ...]]:
        return [
            (
                "  " * row.depth + row.name,
                row.module_type,
                _shapes(row.input_shapes),
                _shapes(row.output_shapes),
                f"{row.params:,}",
                f"{row.frozen:,}",
                f"{row.buffers:,}",
                f"{row.flops:,}",
                str(row.unknown_ops),
                f"{row.output_bytes:,}",
            )  # fmt: skip
            for row in self.rows
        ]

    def footer(self) -> str:
        """The totals line."""
        t = self.totals
        unknown = f" + {t['unknown_ops']} ops of unknown cost" if t["unknown_ops"] else ""
        return (
            f"params: {t['params']:,} trainable, {t['frozen']:,} frozen, "
            f"{t['buffers']:,} buffer elements; FLOPs: {t['flops']:,} "
            f"(MACs {t['macs']:,}){unknown}; activations: {t['activation_bytes']:,} bytes"
        )

    def __str__(self) -> str:
        return format_table(_HEADER, self._cells()) + "\n" + self.footer()

    def __repr__(self) -> str:
        return f"<ModuleSummary: {len(self.rows)} module calls, {self.totals['flops']:,} FLOPs>"

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{html.escape(h)}</th>" for h in _HEADER)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>"
            for cells in self._cells()
        )
        foot = html.escape(self.footer())
        return f"<table><tr>{head}</tr>{body}</table><p>{foot}</p>"


def summary(target: Any, args: Any = (), kwargs: Mapping[str, Any] | None = None) -> ModuleSummary:
    """Summarise a model's forward (or a trace) per module call, as torchinfo does.

    Args:
        target: a :class:`~torchlens.trace.Trace`, or a model to trace once with
            ``structure_only=True`` (no values are kept).
        args: the model's positional arguments (ignored for a trace).
        kwargs: the model's keyword arguments (ignored for a trace).

    Returns:
        A :class:`ModuleSummary`; ``print`` it, or read ``.rows`` and ``.totals``.
        Parameters and buffers count under the module that owns them: for a model, all of
        them (as torchinfo counts); for a trace, those the forward read.

    Raises:
        Whatever :func:`torchlens.trace` raises for the model.

    Example:
        >>> import torch, torchlens as tl
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
        >>> s = tl.summary(model, torch.randn(2, 4))
        >>> s["0:1"].flops, s["0:1"].params, s.totals["unknown_ops"]
        (48, 15, 1)
    """
    if isinstance(target, Trace):
        return module_summary(target)
    trace = _trace(target, args, kwargs, structure_only=True)
    weights = None
    if isinstance(target, nn.Module):
        weights = [
            (address, "parameter", p.numel(), p.requires_grad)
            for address, p in target.named_parameters()
        ] + [(address, "buffer", b.numel(), False) for address, b in target.named_buffers()]
    return module_summary(trace, weights)


Weight = tuple[str, str, int, bool]  # address, "parameter" | "buffer", elements, trainable


def module_summary(trace: Trace, weights: list[Weight] | None = None) -> ModuleSummary:
    """The :class:`ModuleSummary` of a finished trace (see :func:`summary`); ``weights``
    replaces the parameters and buffers the trace read (a model's full list)."""
    if weights is None:
        weights = [
            (s.label, s.kind, math.prod(s.shape), s.requires_grad)
            for s in trace.sources
            if s.kind in ("parameter", "buffer")
        ]
    costs = {op.label: op_flops(op, lambda label: trace[label].shape) for op in trace.ops}
    called = set(trace.modules.addresses())
    rows = [
        _row(trace, call, costs, weights, _depth(call.address, called)) for call in trace.modules
    ]
    known = [c for c in costs.values() if c is not None]
    return ModuleSummary(
        rows,
        {
            **_count(weights),
            "flops": sum(known),
            "macs": sum(known) // 2,
            "unknown_ops": len(costs) - len(known),
            "activation_bytes": sum(_nbytes(op) for op in trace.ops),
        },
    )


def _count(weights: list[Weight]) -> dict[str, int]:
    """``params`` (trainable), ``frozen`` and ``buffers`` elements of ``weights``."""
    return {
        "params": sum(n for _, kind, n, grad in weights if kind == "parameter" and grad),
        "frozen": sum(n for _, kind, n, grad in weights if kind == "parameter" and not grad),
        "buffers": sum(n for _, kind, n, _ in weights if kind == "buffer"),
    }


def _depth(address: str, called: set[str]) -> int:
    """How many called modules hold ``address``: a container that is never called itself
    (``nn.ModuleList``, ``nn.ModuleDict``) adds no level, so GPT-2's ``transformer.h.0``
    sits one level under ``transformer``, beside ``transformer.drop``."""
    if not address:
        return 0
    parts = address.split(".")
    return 1 + sum(".".join(parts[:n]) in called for n in range(1, len(parts)))


def _row(
    trace: Trace, call: Any, costs: Mapping[str, int | None], weights: list[Weight], depth: int
) -> ModuleRow:
    prefix = f"{call.address}." if call.address else ""
    owned = _count([w for w in weights if w[0].startswith(prefix)])
    inside = [costs[label] for label in call.ops]
    return ModuleRow(
        name=call.name,
        module_type=call.module_type,
        depth=depth,
        input_shapes=tuple(tuple(trace[label].shape) for label in call.inputs),
        output_shapes=tuple(tuple(trace[label].shape) for label in call.outputs),
        params=owned["params"],
        frozen=owned["frozen"],
        buffers=owned["buffers"],
        flops=sum(c for c in inside if c is not None),
        unknown_ops=sum(c is None for c in inside),
        output_bytes=sum(_nbytes(trace[label]) for label in call.outputs),
    )


def _nbytes(record: Any) -> int:
    return math.prod(record.shape) * record.dtype.itemsize


def _shapes(shapes: tuple[tuple[int, ...], ...]) -> str:
    return ", ".join(map(shape_text, shapes)) or "-"


def summary_by(trace: Trace, by: str, select: Any, module: str | None, max_rows: int | None) -> str:
    """``trace.summary(by="module", module=..., max_rows=...)`` as text.

    Raises:
        InvalidArgumentError: ``bad_summary`` for an unknown ``by`` or a selector given
            with ``by="module"`` (selectors pick ops; ``module=`` picks module calls).
    """
    if by != "module" or select is not None:
        problem = f"by={by!r} is not a summary" if by != "module" else "a selector"
        raise InvalidArgumentError(
            f"trace.summary got {problem}; use by='op' (a row per op, filtered by a "
            "selector) or by='module' (a row per module call, filtered by module=)",
            code="bad_summary",
        )
    result = module_summary(trace)
    if module is not None:
        keep = {call.name for call in trace.modules.matching(module)}
        result = ModuleSummary([r for r in result.rows if r.name in keep], result.totals)
    if max_rows is not None and len(result.rows) > max_rows:
        hidden = len(result.rows) - max_rows
        result = ModuleSummary(result.rows[:max_rows], result.totals)
        return f"{result}\n({hidden} module calls not shown: max_rows=None prints all)"
    return str(result)
