"""The data behind the viewer page: ops, groups (module calls and repeated runs), edges.

Everything the page needs is one JSON document built here. It stays proportional to the
number of ops: per op a few short fields, summary statistics and a 16-bin histogram, never the
values themselves unless ``values=`` asks for a few of them.
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from collections import Counter
from typing import Any

import torch

from torchlens._views import dtype_text, shape_text
from torchlens.capture import ArgSlot
from torchlens.trace import Op, Trace
from torchlens.viz.graph import LAYOUT_FUNCS
from torchlens.viz.repeats import CallKey, find_repeats

__all__ = ["viewer_data", "op_verdicts"]

HIST_BINS = 16
DOT_MAX_OPS = 3000  # past this, `dot` takes too long: the page orders branches itself
_DOT_SECONDS = 30


def viewer_data(
    trace: Trace, status: Any = None, values: int = 0, use_dot: bool = True
) -> dict[str, Any]:
    """The page's JSON document for ``trace`` (see :func:`torchlens.viz.show`)."""
    groups, container = _groups(trace)
    verdicts, reasons = op_verdicts(trace, status)
    nodes: list[dict[str, Any]] = []
    index: dict[str, int] = {}
    for source in trace.inputs:
        index[source.label] = len(nodes)
        nodes.append(_source_node(source, container.get(source.label, -1)))
    for op in trace.ops:
        index[op.label] = len(nodes)
        node = _op_node(trace, op, container[op.label], values)
        if op.label in verdicts:
            node["v"] = verdicts[op.label]
        if op.label in reasons:
            node["why"] = reasons[op.label]
        nodes.append(node)
    edges = [[index[p], index[op.label]] for op in trace.ops for p in op.parents if p in index]
    for i, label in enumerate(trace.output_labels, start=1):
        nodes.append({"id": f"output {i}", "k": "output", "t": "output", "s": label, "g": -1})
        if label in index:
            edges.append([index[label], len(nodes) - 1])
    hidden = [
        [index[e.parent], index[e.child]]
        for e in trace.hidden_edges
        if e.parent in index and e.child in index
    ]  # dependencies through Python values validation found: drawn dashed
    repeated = _note_passes(trace, nodes, index)
    hints = _dot_order(nodes, edges) if use_dot else None
    if hints:
        for node, x in zip(nodes, hints):
            node["x"] = x
    return {
        "title": str(trace.meta.get("model_type", "model")),
        "ops": len(trace.ops),
        "nodes": nodes,
        "groups": groups,
        "edges": edges,
        "status": getattr(status, "state", None),
        "counts": {} if status is None else dict(Counter(verdicts.values())),  # the legend
        "hidden": hidden,
        "layout": "graphviz" if hints else "page",
        "repeated": repeated,  # layers run more than once: the page offers a rolled view
    }


def _note_passes(trace: Trace, nodes: list[dict[str, Any]], index: dict[str, int]) -> int:
    """Mark each op of a layer of several passes (``trace.layers``) for the rolled view:
    ``lp`` its ``"layer:pass/passes"``, ``np`` the pass count on the first pass, ``L`` the
    node of the first pass on later passes. Returns how many layers repeat."""
    repeated = trace.layers.repeated
    for name, count in repeated.items():
        ops = trace.layers[name]
        first = index[ops[0].label]
        nodes[first]["np"] = count
        for number, op in enumerate(ops, 1):
            node = nodes[index[op.label]]
            node["lp"] = f"{name}:{number}/{count}"
            node["P"] = number
            if number > 1:
                node["L"] = first
    return len(repeated)


def op_verdicts(trace: Trace, status: Any) -> tuple[dict[str, str], dict[str, list[str]]]:
    """Each op's verdict under ``status`` (passed/incomplete/failed/unverified) and the
    reasons found: ``status.verdicts`` where the status has them (each op's state, arm by
    arm), else its failures and gaps."""
    if status is None:
        return {}, {}
    by_op = getattr(status, "verdicts", None)
    if by_op and status.state != "unavailable":
        verdicts, reasons = {}, {}
        for op in trace.ops:
            verdict = by_op.get(op.label)
            if verdict is None:
                continue
            verdicts[op.label] = verdict.state
            if verdict.state != "passed" and verdict.reasons:
                reasons[op.label] = list(verdict.reasons)
        return verdicts, reasons
    reasons: dict[str, list[str]] = {}
    for finding in [*status.failures, *status.unchecked]:
        reasons.setdefault(finding.label, []).append(f"[{finding.arm}] {finding.reason}")
    default = "unverified" if status.state == "unavailable" else "passed"
    found = {f.label: "unverified" for f in status.unchecked}
    found.update({f.label: "failed" for f in status.failures})  # a failure outranks a gap
    return {op.label: found.get(op.label, default) for op in trace.ops}, reasons


def _groups(trace: Trace) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Boxes that unfold: module calls of several ops, and runs of identical calls.

    Returns the groups (parents before children) and, for each op and input, the index of
    the innermost group holding it (-1 for the root).
    """
    calls = {(m.address, m.call_index): m for m in trace.modules[1:] if len(m.ops) > 1}
    counts = Counter(address for address, _ in calls)
    run_of = {key: r for r in find_repeats(trace) for key in r.calls if r.calls[0] in calls}
    groups: list[dict[str, Any]] = []
    index: dict[Any, int] = {}

    def group_of(stack: tuple[CallKey, ...]) -> int:
        if not stack:
            return -1
        key = stack[-1]
        if key in index:
            return index[key]
        parent = group_of(stack[:-1])
        run = run_of.get(key)
        if run is not None:
            if run.calls not in index:
                first, last = run.calls[0][0], run.calls[-1][0]
                title = f"{first} .. {last}" if first != last else f"{first} calls"
                index[run.calls] = len(groups)
                groups.append(
                    {
                        "id": f"run {first}:{run.calls[0][1]}",
                        "t": title,
                        "m": run.module_type,
                        "p": parent,
                        "r": run.count,
                    }  # fmt: skip
                )
            parent = index[run.calls]
        call = calls[key]
        title = call.address + (f" call {call.call_index}" if counts[call.address] > 1 else "")
        index[key] = len(groups)
        groups.append(
            {
                "id": f"{call.address}:{call.call_index}",
                "t": title,
                "m": call.module_type,
                "p": parent,
                "n": len(call.ops),
            }  # fmt: skip
        )
        return index[key]

    container: dict[str, int] = {}
    for op in trace.ops:
        stack = op.module_stack
        while stack and stack[-1] not in calls:
            stack = stack[:-1]
        container[op.label] = group_of(stack)
    _count_ops(groups, container)
    return groups, container


def _count_ops(groups: list[dict[str, Any]], container: dict[str, int]) -> None:
    """Give run groups an op count: the sum over their calls."""
    for group in groups:
        group.setdefault("n", 0)
    for group in groups:
        if "r" not in group and group["p"] >= 0 and "r" in groups[group["p"]]:
            groups[group["p"]]["n"] += group["n"]


def _source_node(source: Any, group: int) -> dict[str, Any]:
    return {
        "id": source.label,
        "k": "input",
        "t": source.label,
        "s": shape_text(source.shape),
        "dt": dtype_text(source.dtype),
        "path": source.path,
        "g": group,
    }


def _op_node(trace: Trace, op: Op, group: int, values: int) -> dict[str, Any]:
    node: dict[str, Any] = {
        "id": op.label,
        "k": "layout" if op.func_name in LAYOUT_FUNCS else "op",
        "t": op.label,
        "f": op.func_name,
        "s": shape_text(op.shape),
        "dt": dtype_text(op.dtype),
        "dev": str(op.device),
        "g": group,
        "ms": [f"{a}:{c}" for a, c in op.module_stack],
        "mt": op.module_type,
        "par": [p for p in op.parents if not _is_param(trace, p)],
        "w": [p for p in op.parents if _is_param(trace, p)],
        "ch": list(op.children),
        "a": _call_text(op),
    }
    if op.is_inplace:
        node["ip"] = 1
    escapes = [str(e) for e in trace.escapes if e.label == op.label]
    if escapes:  # its value left torch for Python: marked in the panel
        node["esc"] = escapes
    hidden = trace.hidden_parents(op.label)
    if hidden:
        node["hp"] = list(hidden)
    if op.has_out:
        node.update(_stats(op.out, values))
    return node


def _is_param(trace: Trace, label: str) -> bool:
    record = trace.get(label)
    return getattr(record, "kind", "") in ("parameter", "buffer", "constant")


def _stats(value: Any, values: int) -> dict[str, Any]:
    """min, max, mean, std, fraction of zeros, NaN/Inf counts and a histogram of the value."""
    if not isinstance(value, torch.Tensor) or value.is_complex() or value.numel() == 0:
        return {}
    flat = value.detach().reshape(-1).to("cpu", torch.float64)
    nan, inf = int(torch.isnan(flat).sum()), int(torch.isinf(flat).sum())
    finite = flat[torch.isfinite(flat)] if nan or inf else flat
    stats: dict[str, Any] = {
        "zeros": _num(int((flat == 0).sum()) / flat.numel()),
        "nan": nan,
        "inf": inf,
    }
    if finite.numel():
        lo, hi = finite.min().item(), finite.max().item()
        std = finite.std().item() if finite.numel() > 1 else 0.0
        stats.update(min=_num(lo), max=_num(hi), mean=_num(finite.mean().item()), std=_num(std))
        stats["hist"] = _histogram(finite, lo, hi)
    if values:
        stats["vals"] = [_num(v) for v in flat[:values].tolist()]
    return {"st": stats}


def _histogram(finite: torch.Tensor, lo: float, hi: float) -> list[int]:
    """Counts in ``HIST_BINS`` equal bins over ``[lo, hi]`` (the top bin includes ``hi``)."""
    scale = HIST_BINS / (hi - lo) if hi > lo else 0.0
    bins = ((finite - lo) * scale).long().clamp_(0, HIST_BINS - 1)
    return torch.bincount(bins, minlength=HIST_BINS).tolist()


def _num(x: float) -> float | str:
    return float(f"{x:.5g}") if math.isfinite(x) else str(x)


def _call_text(op: Op) -> str:
    """``linear(input_1, 0.weight, 0.bias)``: the call with tensors named by their label."""
    slots = [ref.label for ref in op.parent_args]
    args = [_arg_text(a, slots) for a in op.args_template]
    args += [f"{k}={_arg_text(v, slots)}" for k, v in op.kwargs_template.items()]
    return f"{op.func_name}({', '.join(args)})"


def _arg_text(value: Any, slots: list[str], depth: int = 0) -> str:
    if isinstance(value, ArgSlot):
        return slots[value.index] if value.index < len(slots) else "<tensor>"
    if isinstance(value, (list, tuple)) and depth < 3:
        inner = ", ".join(_arg_text(v, slots, depth + 1) for v in value[:8])
        more = ", ..." if len(value) > 8 else ""
        return f"[{inner}{more}]" if isinstance(value, list) else f"({inner}{more})"
    if isinstance(value, torch.Tensor):
        return f"tensor{shape_text(tuple(value.shape))}"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _dot_order(nodes: list[dict[str, Any]], edges: list[list[int]]) -> list[float] | None:
    """Each node's x position in Graphviz's layout of the flat graph, or None without ``dot``.

    Graphviz is good at ordering branches to avoid crossings; the page uses these positions to
    order boxes left to right and places them itself, so that groups unfold instantly.
    """
    if shutil.which("dot") is None or len(nodes) > DOT_MAX_OPS:
        return None
    lines = ["digraph g {", 'node [shape=box, width=1, height=0.3, label=""];']
    lines += [f"n{a} -> n{b};" for a, b in edges]
    lines += [f"n{i};" for i in range(len(nodes))]
    lines.append("}")
    try:
        result = subprocess.run(
            ["dot", "-Tplain"],
            input="\n".join(lines),
            capture_output=True,
            text=True,
            timeout=_DOT_SECONDS,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    xs: list[float] = [0.0] * len(nodes)
    for match in re.finditer(r"^node n(\d+) (\S+)", result.stdout, re.MULTILINE):
        xs[int(match.group(1))] = round(float(match.group(2)), 2)
    return xs
