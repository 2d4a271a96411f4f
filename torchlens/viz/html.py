"""Compact HTML tables for notebooks: ``Trace._repr_html_`` and ``Op._repr_html_``.

Every piece of text from the trace is escaped, so labels, addresses and paths can never
inject markup into a notebook.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from html import escape

from torchlens._views import dtype_text, shape_text
from torchlens.trace import Op, Trace

__all__ = ["op_html", "trace_html"]

_TABLE = '<table style="border-collapse:collapse;font-family:monospace;font-size:12px">'
_CELL = 'style="text-align:left;padding:1px 8px;border-bottom:1px solid #ddd"'


def trace_html(trace: Trace, max_rows: int = 40) -> str:
    """A heading with counts and a table of ops (the first and last rows when there are many).

    Example:
        >>> import torch, torchlens as tl
        >>> html = trace_html(tl.trace(torch.nn.Linear(4, 3), torch.randn(2, 4)))
        >>> "<table" in html and "linear_1" in html
        True
    """
    ops = trace.ops
    shown: list[Op | None] = list(ops)
    if len(ops) > max_rows:
        half = max_rows // 2
        shown = [*ops[:half], None, *ops[-half:]]
    rows = [
        ("…", f"{len(ops) - 2 * (max_rows // 2)} more ops", "", "", "")
        if op is None
        else (op.label, op.func_name, op.address or "-", shape_text(op.shape), dtype_text(op.dtype))
        for op in shown
    ]
    head = (
        f"<b>Trace</b> of {escape(str(trace.meta.get('model_type', 'model')))}: "
        f"{len(ops)} ops, {len(trace.sources)} sources ({len(trace.inputs)} inputs), "
        f"{len(trace.modules)} module calls; outputs: "
        f"{escape(', '.join(trace.output_labels) or '-')}"
    )
    table = _table(("op", "function", "module call", "shape", "dtype"), rows)
    return f"<div>{head}{table}</div>"


def op_html(op: Op) -> str:
    """A two-column table of one op's fields: function, module call, edges, shape, value.

    Example:
        >>> import torch, torchlens as tl
        >>> trace = tl.trace(torch.nn.Sequential(torch.nn.ReLU()), torch.randn(2, 4))
        >>> "relu" in op_html(trace["relu_1"])
        True
    """
    saved = "yes" if op.has_out else "no"
    rows = [
        ("function", op.func_name),
        ("module call", op.address or "-"),
        ("parents", ", ".join(op.parents) or "-"),
        ("children", ", ".join(op.children) or "-"),
        ("shape", shape_text(op.shape)),
        ("dtype", dtype_text(op.dtype)),
        ("device", str(op.device)),
        ("requires_grad", str(op.requires_grad)),
        ("in-place", str(op.is_inplace)),
        ("value saved", saved),
    ]
    return f"<div><b>Op</b> {escape(op.label)}{_table(('field', 'value'), rows)}</div>"


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    head = "".join(f"<th {_CELL}>{escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td {_CELL}>{escape(str(cell))}</td>" for cell in row) + "</tr>"
        for row in rows
    )
    return f"{_TABLE}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
