"""Write a :class:`~torchlens.viz.graph.View` as Graphviz DOT text, with the house style.

Plain string building, no Graphviz needed: ``to_dot`` works where the ``dot`` program is not
installed. Output is deterministic (trace order throughout), so the same trace and options give
the same text byte for byte.
"""

from __future__ import annotations

from html import escape

from torchlens.errors import InvalidArgumentError
from torchlens.trace import Trace
from torchlens.viz.graph import Cluster, Node, View, build_view

__all__ = ["to_dot", "view_to_dot"]

_GRAPH = {
    "fontname": "Helvetica",
    "fontsize": "12",
    "labelloc": "t",
    "nodesep": "0.25",
    "ranksep": "0.3",
    "newrank": "true",
}
_NODE = {
    "shape": "box",
    "style": "rounded,filled",
    "fillcolor": "#ffffff",
    "color": "#7a8599",
    "fontname": "Helvetica",
    "fontsize": "11",
    "margin": "0.12,0.04",
    "height": "0.3",
}
_EDGE = {"color": "#5c6678", "arrowsize": "0.6", "penwidth": "0.9"}
_KIND_STYLE = {
    "op": {},
    "layout": {"fillcolor": "#f6f7f9", "color": "#b3bac7", "fontcolor": "#4d5360"},
    "input": {"shape": "oval", "fillcolor": "#d9f2d9", "color": "#3d8b3d"},
    "output": {"shape": "oval", "fillcolor": "#fde0d6", "color": "#c0503a"},
    "param": {"fillcolor": "#fff6cc", "color": "#b59a2a", "fontsize": "9", "height": "0.2"},
    "module": {"shape": "box3d", "style": "filled", "fillcolor": "#dce8fa", "color": "#4a6fa5"},
}
_CLUSTER_FILLS = ("#f3f5f9", "#e8edf5", "#dde5f1", "#d3ddec")
_PARAM_COLOR = "#8a6d00"
_DIM_COLOR = "#5b6272"
_REPEAT_COLOR = "#c26a00"
_MODULE_COLOR = "#2f5597"
_WEIGHTED_FILL = "#fff9e6"


def to_dot(
    trace: Trace,
    depth: int | None = None,
    collapse_repeats: bool = False,
    params: str = "fold",
    rankdir: str = "TB",
    rolled: bool = False,
) -> str:
    """The trace's graph as Graphviz DOT text: ops, inputs, outputs and module clusters.

    A module call of several ops is a cluster (``subgraph "cluster_ADDRESS:CALL"``), nested
    like the calls; a call of a single op is named inside that op's node instead.

    Args:
        trace: what to draw.
        depth: draw module calls nested at most ``depth`` deep as clusters; each call deeper
            than that becomes one node, with its edges re-routed to it. ``None`` draws all;
            ``0`` draws every top-level module call as one node.
        collapse_repeats: draw runs of identical consecutive module calls (same type, same
            ops and wiring, e.g. 12 transformer layers) once, titled ``x12``.
        params: ``"fold"`` lists parameters, buffers and constants inside the op that reads
            them; ``"nodes"`` draws them as small nodes; ``"hide"`` leaves them out.
        rankdir: Graphviz layout direction, ``"TB"`` (top to bottom) or ``"LR"``.
        rolled: draw each layer (``trace.layers``: the same code run again, as in a loop)
            once, marked ``xN passes``, with the edges that carry a value from one pass to
            another labelled with the passes they connect (``1→2 … 19→20``); see
            ``docs/loops.md``. Not with ``collapse_repeats``.

    Returns:
        DOT source; the same trace and options always give the same text.

    Raises:
        InvalidArgumentError: for a negative depth or an unknown ``params``/``rankdir``.

    Example:
        >>> import torch, torchlens as tl
        >>> block = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
        >>> text = to_dot(tl.trace(torch.nn.Sequential(block), torch.randn(2, 4)))
        >>> '"linear_1" -> "relu_1"' in text, 'subgraph "cluster_0:1"' in text
        (True, True)
    """
    if rankdir not in ("TB", "LR", "BT", "RL"):
        raise InvalidArgumentError(
            f"rankdir must be TB, LR, BT or RL, got {rankdir!r}", code="bad_option"
        )
    view = build_view(trace, depth, collapse_repeats, params, rolled)
    return view_to_dot(view, rankdir)


def view_to_dot(view: View, rankdir: str = "TB") -> str:
    """DOT text for an already built view."""
    lines = ["digraph torchlens {"]
    graph = {**_GRAPH, "rankdir": rankdir}
    lines.append(f"  graph [{_attrs(graph)}, label=<<B>{escape(view.title)}</B>>];")
    lines.append(f"  node [{_attrs(_NODE)}];")
    lines.append(f"  edge [{_attrs(_EDGE)}];")
    _write_cluster(view, view.root, lines, "  ")
    for a, b in view.edges:
        passes = view.edge_labels.get((a, b))
        if passes:  # a value carried from one pass of a loop to another (rolled views)
            back = ", constraint=false" if "→" in passes else ""  # pass k -> k+1: no rank
            lines.append(f"  {_quote(a)} -> {_quote(b)} [color={_quote(_REPEAT_COLOR)}, "
                         f"fontcolor={_quote(_REPEAT_COLOR)}, fontname=Helvetica, fontsize=9, "
                         f"penwidth=1.4{back}, label={_quote(passes)}];")  # fmt: skip
        else:
            lines.append(f"  {_quote(a)} -> {_quote(b)};")
    _write_escapes(view, lines)
    lines.append("}")
    return "\n".join(lines) + "\n"


def _write_escapes(view: View, lines: list[str]) -> None:
    """Each escape as a small note hanging off the record Python read (dotted), each
    hidden edge as a dashed red edge labelled with the escape it goes through."""
    for i, (node, text) in enumerate(view.escapes, start=1):
        note = f"escape {i}"
        lines.append(f"  {_quote(note)} [shape=note, style=filled, fillcolor=\"#fff3cd\", "
                     f"fontsize=9, label={_quote(text)}];")  # fmt: skip
        lines.append(f"  {_quote(node)} -> {_quote(note)} [style=dotted, arrowhead=none];")
    for a, b, text in view.hidden:
        lines.append(f"  {_quote(a)} -> {_quote(b)} [style=dashed, color=\"#d0312d\", "
                     f"fontsize=9, label={_quote(text)}];")  # fmt: skip


def _write_cluster(view: View, cluster: Cluster, lines: list[str], indent: str) -> None:
    if cluster.depth:
        lines.append(f"{indent}subgraph {_quote('cluster_' + cluster.id)} {{")
        inner = indent + "  "
        fill = _CLUSTER_FILLS[(cluster.depth - 1) % len(_CLUSTER_FILLS)]
        style = {"style": "rounded,filled", "fillcolor": fill, "color": "#9aa5b8"}
        if cluster.repeat > 1:
            style.update(style="rounded,filled,bold", color=_REPEAT_COLOR, penwidth="2")
        lines.append(f"{inner}graph [{_attrs(style)}, labeljust=l, fontsize=11,")
        lines.append(f"{inner}  label={_cluster_label(cluster)}];")
    else:
        inner = indent
    for node_id in cluster.nodes:
        lines.append(f"{inner}{_node_statement(view.nodes[node_id])}")
    for child in cluster.children:
        _write_cluster(view, child, lines, inner)
    if cluster.depth:
        lines.append(f"{indent}}}")


def _node_statement(node: Node) -> str:
    style = dict(_KIND_STYLE[node.kind])
    if node.kind == "op" and node.params:  # ops with weights: the model's layers
        style["fillcolor"] = _WEIGHTED_FILL
    if node.inplace:
        style["style"] = "rounded,filled,dashed"
    if node.repeat > 1:
        style.update(color=_REPEAT_COLOR, penwidth="2")
    style["tooltip"] = node.tooltip
    return f"{_quote(node.id)} [{_attrs(style)}, label={_node_label(node)}];"


def _node_label(node: Node) -> str:
    size = 9 if node.kind == "param" else 11
    parts = [f'<FONT POINT-SIZE="{size}"><B>{escape(node.title)}</B></FONT>']
    if node.module:
        color = _REPEAT_COLOR if node.repeat > 1 else _MODULE_COLOR
        parts.append(_font(node.module, 9, color))
    parts += [_font(line, 9, _DIM_COLOR) for line in node.lines]
    parts += [_font(line, 8, _PARAM_COLOR) for line in node.params]
    return "<" + "<BR/>".join(parts) + ">"


def _cluster_label(cluster: Cluster) -> str:
    title = cluster.title
    if cluster.repeat > 1:
        head, _, count = title.rpartition(" x")
        return (
            f'<<B>{escape(head)}</B> <FONT COLOR="{_REPEAT_COLOR}"><B>x{escape(count)}</B></FONT>>'
        )
    address, _, rest = title.partition(" ")
    return f"<<B>{escape(address)}</B> {escape(rest)}>"


def _font(text: str, size: int, color: str) -> str:
    return f'<FONT POINT-SIZE="{size}" COLOR="{color}">{escape(text)}</FONT>'


def _attrs(attrs: dict[str, str]) -> str:
    return ", ".join(f"{key}={_quote(value)}" for key, value in attrs.items())


def _quote(text: str) -> str:
    """A DOT double-quoted string: backslashes and quotes escaped, newlines kept as ``\\n``."""
    body = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{body}"'
