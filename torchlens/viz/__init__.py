"""Seeing the graph: DOT text, rendered drawings and notebook tables of a trace.

``to_dot`` needs nothing but Python; ``draw`` needs Graphviz's ``dot`` program. Both are also
methods of :class:`~torchlens.trace.Trace` (``trace.to_dot()``, ``trace.draw("g.svg")``).
"""

from torchlens.viz.dot import to_dot
from torchlens.viz.html import op_html, trace_html
from torchlens.viz.render import FORMATS, DrawingSizeWarning, draw

__all__ = ["FORMATS", "DrawingSizeWarning", "draw", "op_html", "to_dot", "trace_html"]
