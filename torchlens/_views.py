"""Read-only views over a trace's records: module calls by address, and the summary table.

Kept apart from :mod:`torchlens.trace` so the data model stays a list of typed records; the
functions here only read them. Nothing here imports the data model or the selectors at
module level (they sit at the same layer or above).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from torchlens._patterns import module_pattern
from torchlens._table import format_table
from torchlens.errors import LookupFailedError

__all__ = [
    "MORE_ROWS_HINT",
    "ModuleCalls",
    "OpSequence",
    "SUMMARY_ROWS",
    "filter_ops",
    "missing_label_message",
    "module_types",
    "not_found_message",
    "note_returns",
    "summary_text",
    "shape_text",
    "dtype_text",
]

SUMMARY_ROWS = 40  # rows ``print(trace)`` shows before it keeps only the head and the tail


class OpSequence:
    """What a trace and a recording share: their ``ops`` in execution order, records by
    label (``_by_label``), and the ``meta`` that says whether the forward halted."""

    ops: list[Any]
    meta: dict[str, Any]
    _by_label: Mapping[str, Any]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.ops)

    def __len__(self) -> int:
        return len(self.ops)

    def __contains__(self, label: object) -> bool:
        return label in self._by_label

    @property
    def labels(self) -> list[str]:
        """Op labels in execution order."""
        return [op.label for op in self.ops]

    @property
    def halted(self) -> bool:
        """Whether ``stop_after=`` ended the forward early (then ``output`` is None)."""
        return bool(self.meta.get("halted", False))


def not_found_message(key: str, known: Iterable[str], what: str = "label") -> str:
    """``"no label 'x' in this trace; close labels: ..."``."""
    close = difflib.get_close_matches(key, list(known), n=5, cutoff=0.5)
    hint = f"; close {what}s: {', '.join(close)}" if close else ""
    return f"no {what} {key!r} in this trace{hint}"


def _split_key(key: str) -> tuple[str, int | None]:
    """``"blocks.0:2"`` -> ``("blocks.0", 2)``; ``"<root>:1"`` and ``""`` are the root."""
    address, sep, call = key.rpartition(":")
    if not sep or not call.isdigit():
        address, call = key, ""
    if address == "<root>":
        address = ""
    return address, int(call) if call else None


class ModuleCalls(list):
    """``trace.modules``: every module call in call order, also reachable by address.

    It is a list (iterate, index by position, slice), and a string key looks a call up:
    ``"blocks.0:2"`` is the second call of ``blocks.0`` (the way ``op.address`` and
    ``ModuleCall.name`` write it), ``"blocks.0"`` the only call of a module called once,
    and ``""`` (or ``"<root>:1"``) the traced model itself.

    Example:
        >>> import torch, torchlens as tl
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
        >>> trace = tl.trace(model, torch.randn(2, 4))
        >>> trace.modules["0"].module_type, trace.modules["1:1"].outputs
        ('Linear', ('relu_1',))
    """

    def __getitem__(self, key: Any) -> Any:
        if not isinstance(key, str):
            return super().__getitem__(key)
        address, call = _split_key(key)
        calls = [m for m in self if m.address == address]
        if call is not None:
            calls = [m for m in calls if m.call_index == call]
        if len(calls) == 1:
            return calls[0]
        if calls:
            names = ", ".join(repr(m.name) for m in calls[:4])
            raise LookupFailedError(
                f"module {address!r} was called {len(calls)} times; pick one call with "
                f"trace.modules['{address}:N'] ({names}, ...) or get all of them with "
                f"trace.module_calls({address!r})",
                code="ambiguous_module",
            )
        raise LookupFailedError(not_found_message(key, self.addresses(), what="module"))

    def addresses(self) -> list[str]:
        """Every module address that was called, first call order, each once."""
        return list(dict.fromkeys(m.address for m in self))

    def matching(self, pattern: str) -> list[Any]:
        """Every call of a module whose address matches ``pattern``, in call order.

        ``pattern`` follows :func:`torchlens.module`: an address, or a glob (``*`` also
        crosses dots, a ``+`` segment matches one name: ``"blocks.+"`` is the direct
        children of ``blocks``); ``"blocks.0:2"`` picks one call.

        Raises:
            LookupFailedError: nothing matched; the message lists close addresses.
            InvalidArgumentError: ``bad_selector`` for a pattern with an empty segment.
        """
        address, call = _split_key(pattern)
        regex = module_pattern(address)
        found = [
            m
            for m in self
            if (regex.match(m.address) if regex else m.address == address)
            and (call is None or m.call_index == call)
        ]
        if not found:
            raise LookupFailedError(not_found_message(pattern, self.addresses(), what="module"))
        return found


def missing_label_message(key: str, labels: Iterable[str], modules: ModuleCalls) -> str:
    """Why ``trace[key]`` found nothing: a module address is pointed to its calls."""
    address = key.rpartition(":")[0] if key.rpartition(":")[2].isdigit() else key
    if address and address in modules.addresses():
        return (
            f"{key!r} is a module address, not an op label; its calls are "
            f"trace.modules[{key!r}] (or trace.module_calls({address!r})), with .outputs "
            f"and .ops (labels to look up here), and tl.module({address!r}) selects the ops "
            "inside it"
        )
    return not_found_message(key, labels)


def filter_ops(ops: Sequence[Any], select: Any, module: str | None) -> tuple[list, list[str]]:
    """The ops a summary shows (``select`` and ``module`` as for ``Trace.summary``), and a
    note per filter for its heading."""
    from torchlens.selectors import as_selector  # same layer as the data model: lazily
    from torchlens.selectors import module as module_selector

    shown, notes = list(ops), []
    filters = (("select", select, as_selector), ("module", module, module_selector))
    for name, value, to_selector in filters:
        if value is not None:
            matches = to_selector(value).matches
            shown = [op for op in shown if matches(op)]
            notes.append(f"{name}={value!r}")
    return shown, notes


# How to see the rows a cut table leaves out, in the words of the Python API; the command
# line passes its own flags instead.
MORE_ROWS_HINT = (
    "trace.summary(max_rows=None) prints all, trace.summary(select=..., module=...) narrows "
    "the table"
)


def summary_text(
    trace: Any,
    ops: Sequence[Any],
    max_rows: int | None,
    filtered: Iterable[str] = (),
    more_hint: str = MORE_ROWS_HINT,
) -> str:
    """The trace's heading, a table of ``ops`` (head and tail past ``max_rows``), outputs;
    ``more_hint`` says how to see the rows left out."""
    repeated = trace.layers.repeated  # layer -> passes, of the layers run more than once
    rows = [_row(op) + (_pass_cell(op, repeated),) * bool(repeated) for op in ops]
    hidden = 0
    if max_rows is not None and len(rows) > max_rows:
        head = max(max_rows // 2, 1)
        tail = max(max_rows - head, 0)
        hidden = len(rows) - head - tail
        gap = ("...", f"{hidden} more ops", "", "", "") + ("",) * bool(repeated)
        rows = [*rows[:head], gap, *(rows[-tail:] if tail else [])]
    columns = ("op", "function", "module call", "shape", "dtype")
    table = format_table(columns + ("layer:pass",) * bool(repeated), rows)
    heading = (
        f"Trace: {len(trace.ops)} ops, {len(trace.sources)} sources "
        f"({len(trace.inputs)} inputs), {len(trace.modules)} module calls"
    )
    notes = list(filtered)
    if notes:
        heading += f"; showing {len(ops)} ops ({', '.join(notes)})"
    lines = [heading]
    trap = train_mode_note(trace)
    if trap:
        lines.append(trap)
    lines.append(table)
    if hidden:
        lines.append(f"({hidden} ops not shown: {more_hint})")
    lines.append(f"outputs: {', '.join(trace.output_labels) or '-'}")
    if repeated and not notes:
        lines.append(_layers_line(trace, repeated))
    fallbacks = trace.meta.get("fallback_modules")
    if fallbacks:
        named = ", ".join(fallbacks[:3]) + (", ..." if len(fallbacks) > 3 else "")
        lines.append(
            f"modules outside the root are named by class ({named}); name them with "
            "tl.trace(..., root={'name': module})"
        )
    lines += escape_lines(trace)
    return "\n".join(lines)


def escape_lines(trace: Any, limit: int = 10) -> list[str]:
    """The trace's escapes (values read by Python) and hidden edges (dependencies through
    them that validation proved), one a line, the first ``limit`` of each."""
    lines: list[str] = []
    sections = (
        ("escapes", "values read by Python", getattr(trace, "escapes", ())),
        ("hidden edges", "dependencies through escapes", getattr(trace, "hidden_edges", ())),
    )
    for title, what, items in sections:
        if items:
            lines.append(f"{title} ({len(items)}, {what}):")
            lines += [f"  {item}" for item in items[:limit]]
            if len(items) > limit:
                lines.append(f"  ... and {len(items) - limit} more")
    return lines


# Functions whose output depends on training mode, and where their ``training`` flag sits.
_TRAIN_FLAGS = {
    "dropout": (2, "training"), "dropout1d": (2, "training"), "dropout2d": (2, "training"),
    "dropout3d": (2, "training"), "alpha_dropout": (2, "training"),
    "feature_alpha_dropout": (2, "training"), "batch_norm": (5, "training"),
}  # fmt: skip


def train_mode_note(trace: Any) -> str:
    """A line naming the dropout and batch-norm ops that ran in training mode, if any:
    tracing a model left in train mode is a silent trap (random masks, batch statistics)."""
    counts: dict[str, int] = {}
    for op in trace.ops:
        flag = _TRAIN_FLAGS.get(op.func_name)
        if flag is None or op.output_index:
            continue
        index, name = flag
        args, kwargs = op.args_template, op.kwargs_template
        training = kwargs[name] if name in kwargs else (args[index] if len(args) > index else False)
        if training is True:
            counts[op.func_name] = counts.get(op.func_name, 0) + 1
    if not counts:
        return ""
    found = ", ".join(f"{n} {name}" for name, n in sorted(counts.items()))
    return (
        f"note: traced in training mode: {found} op(s) used random masks or batch "
        "statistics; call model.eval() before tracing for inference behaviour"
    )


def _pass_cell(op: Any, repeated: Mapping[str, int]) -> str:
    """``"linear_1:2/5"`` for the 2nd of 5 passes; blank for an op run once."""
    layer = op.layer
    return f"{layer}:{op.pass_index}/{repeated[layer]}" if layer in repeated else ""


def _layers_line(trace: Any, repeated: Mapping[str, int], limit: int = 8) -> str:
    """How many layers the ops form and which are repeated, with their pass counts."""
    named = ", ".join(f"{name} x{n}" for name, n in list(repeated.items())[:limit])
    more = f", ... and {len(repeated) - limit} more" if len(repeated) > limit else ""
    return (
        f"layers: {len(trace.layers)}, {len(repeated)} run more than once (passes): {named}{more}"
    )


def _row(op: Any) -> tuple[str, ...]:
    return (op.label, op.func_name, op.address or "-", shape_text(op.shape), dtype_text(op.dtype))


def shape_text(shape: Sequence[int]) -> str:
    """``"(2, 3)"``: a shape as summaries and drawings write it (``"()"`` for a scalar)."""
    return "(" + ", ".join(str(d) for d in shape) + ")"


def dtype_text(dtype: Any) -> str:
    """``"float32"``: a dtype without its ``torch.`` prefix."""
    return str(dtype).removeprefix("torch.")


def module_types(calls: Iterable[Any]) -> Mapping[str, str]:
    """Address -> class name, from a trace's module calls."""
    return {m.address: m.module_type for m in calls}


def note_returns(calls: Iterable[Any], records: Mapping[str, Any]) -> None:
    """Set each op's ``returned_by``: the module calls that returned its value, in call
    order, the root's (``("", k, type)``: the model's outputs) first (what a capture noted
    meanwhile is replaced)."""
    seen: set[str] = set()
    for call in calls:
        frame = (call.address, call.call_index, call.module_type)
        for label in call.outputs:
            record = records.get(label)
            if record is None or not hasattr(record, "returned_by"):  # a source
                continue
            if label in seen:
                record.returned_by += (frame,)
            else:
                seen.add(label)
                record.returned_by = (frame,)
