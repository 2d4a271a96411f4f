"""The drawable view of a trace: nodes, edges and nested module clusters, before any syntax.

Building the view is where the choices live (collapse to a depth, fold repeated blocks, fold
parameters into the ops that read them); :mod:`torchlens.viz.dot` only writes it out. Every
list keeps trace order, so the same trace always gives the same view.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from torchlens._views import dtype_text, shape_text
from torchlens.errors import InvalidArgumentError
from torchlens.trace import ModuleCall, Op, Source, Trace
from torchlens.viz.repeats import CallKey, Fold, Repeat, find_repeats, fold_repeats
from torchlens.viz.rolled import pass_text, roll_layers

__all__ = ["Cluster", "Node", "View", "build_view", "LAYOUT_FUNCS", "PARAM_MODES"]

PARAM_MODES = ("fold", "nodes", "hide")  # parameters/buffers/constants: in the op, small, off
_FOLDED_KINDS = ("parameter", "buffer", "constant")
# ops that only rearrange or select data: drawn quieter so the computing ops stand out
LAYOUT_FUNCS = frozenset(
    "view reshape transpose permute contiguous flatten unflatten squeeze unsqueeze expand "
    "expand_as view_as reshape_as t T mT getitem split chunk unbind narrow select slice "
    "movedim swapaxes repeat tile clone detach to type_as".split()
)


@dataclass
class Node:
    """One box: an op, an input, an output, a source, or a collapsed module call."""

    id: str  # unique DOT id: the op/source label, "module ADDRESS:CALL" or "output N"
    kind: str  # "op", "layout" (moves data only), "input", "output", "param", "module"
    title: str  # first line, bold
    lines: list[str] = field(default_factory=list)  # smaller lines under the title
    params: list[str] = field(default_factory=list)  # folded parameters, one per line
    tooltip: str = ""
    inplace: bool = False
    module: str = ""  # the one-op module call drawn inside this node instead of as a cluster
    repeat: int = 1  # how many identical calls this node stands for


@dataclass
class Cluster:
    """One drawn module call: its own nodes and the calls nested in it."""

    id: str  # "ADDRESS:CALL"; "" for the root (the whole graph)
    title: str
    depth: int  # 1 for children of the root
    nodes: list[str] = field(default_factory=list)
    children: list[Cluster] = field(default_factory=list)
    repeat: int = 1  # how many identical calls this cluster stands for


@dataclass
class View:
    """What gets drawn: nodes by id, the root cluster tree, and edges in first-seen order."""

    title: str
    nodes: dict[str, Node]
    root: Cluster
    edges: list[tuple[str, str]]
    # escapes as (node id of the record read, text), hidden edges as (from, to, text)
    escapes: list[tuple[str, str]] = field(default_factory=list)
    hidden: list[tuple[str, str, str]] = field(default_factory=list)
    # rolled views: the passes an edge connects, e.g. "1→2 … 19→20" (edges between passes)
    edge_labels: dict[tuple[str, str], str] = field(default_factory=dict)


def build_view(
    trace: Trace,
    depth: int | None = None,
    collapse_repeats: bool = False,
    params: str = "fold",
    rolled: bool = False,
) -> View:
    """Turn ``trace`` into nodes, edges and clusters; see :func:`torchlens.viz.to_dot`."""
    if depth is not None and (not isinstance(depth, int) or depth < 0):
        raise InvalidArgumentError(
            f"depth must be None (draw every module call) or an int >= 0, got {depth!r}",
            code="bad_depth",
        )
    if params not in PARAM_MODES:
        raise InvalidArgumentError(
            f"params must be one of {', '.join(PARAM_MODES)}, got {params!r}", code="bad_option"
        )
    if rolled and collapse_repeats:
        raise InvalidArgumentError(
            "rolled=True draws each layer once already; leave collapse_repeats off with it",
            code="bad_option",
        )
    if rolled:
        fold = roll_layers(trace)
    elif collapse_repeats:
        fold = fold_repeats(trace, find_repeats(trace))
    else:
        fold = Fold([], {}, {}, set())
    return _ViewBuilder(trace, depth, fold, params, rolled).build()


class _ViewBuilder:
    """Walks the trace once, placing each op's node in its cluster and routing edges."""

    def __init__(
        self, trace: Trace, depth: int | None, fold: Fold, params: str, rolled: bool = False
    ) -> None:
        self.trace, self.depth, self.fold, self.params = trace, depth, fold, params
        self.rolled = rolled
        self.pass_pairs: dict[tuple[str, str], set[tuple[int, int]]] = {}  # rolled views
        # every call but the root (the capture itself: modules[0]); the owner of a traced
        # method is called at "" too, once per call (a decoding step)
        self.calls = {(m.address, m.call_index): m for m in trace.modules[1:]}
        self.call_counts = Counter(m.address for m in self.calls.values())
        self.repeat_of = {r.calls[0]: r for r in fold.repeats}
        dtypes = Counter(op.dtype for op in trace.ops).most_common(1)
        self.dtype = dtypes[0][0] if dtypes else None  # the common one is not printed
        self.nodes: dict[str, Node] = {}
        self.edges: dict[tuple[str, str], None] = {}
        self.root = Cluster("", trace.meta.get("model_type", "model"), 0)
        self.clusters: dict[tuple[CallKey, ...], Cluster] = {(): self.root}
        self.placed_in: dict[str, tuple[CallKey, ...]] = {}  # node id -> cluster path
        self.module_params: dict[str, dict[str, Source]] = {}  # module node -> its params

    def build(self) -> View:
        for source in self.trace.inputs:
            self._source_node(source)
        for op in self.trace.ops:
            self._place(op)
        for op in self.trace.ops:
            self._route(op)
        for i, label in enumerate(self.trace.output_labels, start=1):
            self._output(i, label)
        for node_id, sources in self.module_params.items():
            self.nodes[node_id].params.extend(_source_counts(sources.values()))
        escapes = [(self._drawn(e.label), f"{e.call_text} -> {e.value}")
                   for e in self.trace.escapes if e.label in self.trace]  # fmt: skip
        hidden = [(self._drawn(e.parent), self._drawn(e.child), f"via {e.call_text}")
                  for e in self.trace.hidden_edges
                  if e.parent in self.trace and e.child in self.trace]  # fmt: skip
        view = View(self.root.title, self.nodes, self.root, list(self.edges), escapes, hidden)
        view.edge_labels = self._pass_labels()
        return view

    def _pass_labels(self) -> dict[tuple[str, str], str]:
        """Rolled views: each edge's label from the passes its values went between."""
        labels = {}
        for (a, b), pairs in self.pass_pairs.items():
            text = pass_text(pairs, self._passes(a), self._passes(b))
            if text and (a, b) in self.edges:
                labels[a, b] = text
        return labels

    def _passes(self, node_id: str) -> int:
        record = self.trace.get(node_id)
        return len(self.trace.layers[record.layer]) if isinstance(record, Op) else 1

    # -- nodes ----------------------------------------------------------------------------
    def _drawn(self, label: str) -> str:
        """The node ``label`` is drawn as; a source folded into its reader (a constant made
        from an escaped value) is its first reader's node."""
        node = self.node_of(label)
        record = self.trace[label]
        if node not in self.nodes and isinstance(record, Source) and record.children:
            return self.node_of(record.children[0])
        return node

    def node_of(self, label: str) -> str:
        """The id of the node that ``label`` (op or source) is drawn as."""
        record = self.trace[self.fold.canonical.get(label, label)]
        if isinstance(record, Source):
            return record.label
        stack = record.module_stack
        if self.depth is not None and len(stack) > self.depth:
            address, call = stack[self.depth]
            if len(self.calls[address, call].ops) > 1:
                return f"module {address}:{call}"
        return record.label

    def _clustered(self, stack: tuple[CallKey, ...]) -> tuple[CallKey, ...]:
        """The calls of ``stack`` drawn as clusters: a call of a single op is drawn in it."""
        n = 0
        while n < len(stack) and len(self.calls[stack[n]].ops) > 1:
            n += 1
        return stack[:n] if self.depth is None else stack[: min(n, self.depth)]

    def _place(self, op: Op) -> None:
        if op.label in self.fold.canonical:
            return
        node_id = self.node_of(op.label)
        if node_id in self.nodes:
            return
        stack = op.module_stack
        if node_id == op.label:
            node = self._op_node(op)
            clustered = self._clustered(stack)
            if len(clustered) < len(stack):
                self._name_call(node, stack[len(clustered)], stack[-1], clustered)
            stack = clustered
        else:
            stack = stack[: self.depth + 1]
            node = self._module_node(node_id, self.calls[stack[-1]])
            stack = stack[:-1]
        self._add(node, stack)

    def _op_node(self, op: Op) -> Node:
        lines = [shape_text(op.shape)]
        if op.dtype != self.dtype:
            lines[0] += f" {dtype_text(op.dtype)}"
        tooltip = (
            f"{op.label}: {op.func_name} in {op.address or 'root'}\n"
            f"shape {shape_text(op.shape)} {dtype_text(op.dtype)}\n"
            f"parents: {', '.join(op.parents) or '-'}"
        )
        kind = "layout" if op.func_name in LAYOUT_FUNCS else "op"
        node = Node(op.label, kind, op.label, lines, tooltip=tooltip, inplace=op.is_inplace)
        passes = len(self.trace.layers[op.layer]) if self.rolled else 1
        if passes > 1:
            node.lines.append(f"x{passes} passes")
            node.repeat = passes
        return node

    def _module_node(self, node_id: str, call: ModuleCall) -> Node:
        key = (call.address, call.call_index)
        title = self._call_title(call)
        lines = [f"{len(call.ops)} ops"]
        repeat = self.repeat_of.get(key)
        if repeat is not None:
            title, lines = self._repeat_title(repeat), [f"{len(call.ops)} ops per block"]
        node = Node(node_id, "module", title, lines, tooltip=title)
        node.repeat = repeat.count if repeat is not None else 1
        return node

    def _name_call(
        self, node: Node, outer: CallKey, inner: CallKey, around: tuple[CallKey, ...]
    ) -> None:
        """Name the one-op call(s) around an op inside its node, relative to its cluster."""
        base = around[-1][0] if around else ""
        repeat = self.repeat_of.get(outer)
        if repeat is not None:
            node.module, node.repeat = self._repeat_title(repeat, base), repeat.count
        else:
            node.module = self._call_title(self.calls[inner], base)

    def _add(self, node: Node, stack: tuple[CallKey, ...]) -> None:
        self.nodes[node.id] = node
        self.placed_in[node.id] = stack
        self._cluster(stack).nodes.append(node.id)

    def _source_node(self, source: Source, near: str | None = None) -> str:
        """The node of ``source``; a parameter goes in the cluster of its first reader."""
        if source.label not in self.nodes:
            kind = "input" if source.kind == "input" else "param"
            lines = [source.path] if kind == "input" else [source.kind]
            lines.append(shape_text(source.shape))
            tooltip = f"{source.label}: {source.kind} {shape_text(source.shape)}"
            node = Node(source.label, kind, source.label, lines, [], tooltip)
            self._add(node, self.placed_in.get(near, ()) if near else ())
        return source.label

    def _output(self, index: int, label: str) -> None:
        node_id = f"output {index}"
        record = self.trace[label]
        lines = [label, shape_text(record.shape)]
        self._add(Node(node_id, "output", "output", lines, tooltip=f"output: {label}"), ())
        source = self._source_node(record) if isinstance(record, Source) else None
        self._edge(source or self.node_of(label), node_id)

    # -- clusters and edges ---------------------------------------------------------------
    def _cluster(self, stack: tuple[CallKey, ...]) -> Cluster:
        cluster = self.clusters.get(stack)
        if cluster is None:
            parent = self._cluster(stack[:-1])
            call = self.calls[stack[-1]]
            repeat = self.repeat_of.get(stack[-1])
            title = self._repeat_title(repeat) if repeat else self._call_title(call)
            cluster = Cluster(f"{call.address}:{call.call_index}", title, len(stack))
            cluster.repeat = repeat.count if repeat else 1
            if self.rolled:  # drawn once for every call of the module
                cluster.repeat = self.call_counts.get(call.address, 1)
            parent.children.append(cluster)
            self.clusters[stack] = cluster
        return cluster

    def _call_title(self, call: ModuleCall, base: str = "") -> str:
        title = f"{_relative(call.address, base)} ({call.module_type})"
        calls = self.call_counts.get(call.address, 1)
        if calls > 1 and self.rolled:  # drawn once for all its calls
            title += f" x{calls} calls"
        elif calls > 1:
            title += f" call {call.call_index}"
        return title

    def _repeat_title(self, repeat: Repeat, base: str = "") -> str:
        first, last = (_relative(key[0], base) for key in (repeat.calls[0], repeat.calls[-1]))
        names = f"{first} .. {last}" if first != last else f"{first} calls"
        return f"{names} ({repeat.module_type}) x{repeat.count}"

    def _route(self, op: Op) -> None:
        target = self.node_of(op.label)
        for parent in op.parents:
            record = self.trace[parent]
            if isinstance(record, Source) and record.kind in _FOLDED_KINDS:
                self._param(record, op, target)
            elif isinstance(record, Source):
                self._edge(self._source_node(record), target)
            elif not self.fold.crosses_blocks(parent, op.label):
                self._edge(self.node_of(parent), target)
                if self.rolled:
                    pair = (record.pass_index, op.pass_index)
                    self.pass_pairs.setdefault((self.node_of(parent), target), set()).add(pair)

    def _param(self, source: Source, op: Op, target: str) -> None:
        if self.params == "nodes":
            self._edge(self._source_node(source, near=target), target)
        elif self.params == "fold" and op.label not in self.fold.canonical:
            node = self.nodes[target]
            if node.kind == "module":
                self.module_params.setdefault(target, {})[source.label] = source
                return
            name = _relative(source.label, op.module)
            text = f"{name} {shape_text(source.shape)}"
            if text not in node.params:
                node.params.append(text)

    def _edge(self, source: str, target: str) -> None:
        if source != target:
            self.edges.setdefault((source, target), None)


def _relative(label: str, module: str) -> str:
    """A parameter's name inside the module that reads it: ``weight`` for ``fc.weight``."""
    prefix = module + "." if module else ""
    return label[len(prefix) :] if prefix and label.startswith(prefix) else label


def _source_counts(sources: Iterable[Source]) -> list[str]:
    """``["6 parameters, 1.2K values", "4 buffers, 64 values"]``: each kind on its own line."""
    lines = []
    for kind in _FOLDED_KINDS:
        of_kind = [s for s in sources if s.kind == kind]
        if of_kind:
            numel = sum(math.prod(s.shape) for s in of_kind)
            name = kind if len(of_kind) == 1 else kind + "s"
            lines.append(f"{len(of_kind)} {name}, {_count_text(numel)}")
    return lines


def _count_text(numel: int) -> str:
    """``1.2M values`` style counts for collapsed modules."""
    for scale, unit in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
        if numel >= scale:
            return f"{numel / scale:.1f}{unit} values"
    return f"{numel} values"
