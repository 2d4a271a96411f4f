"""Seeing the graph: DOT text, rendered drawings, notebook tables and an interactive page.

``to_dot`` needs nothing but Python; ``draw`` needs Graphviz's ``dot`` program; ``show``
writes a self-contained HTML page to pan, zoom, unfold and search. All are also methods of
:class:`~torchlens.trace.Trace` (``trace.to_dot()``, ``trace.draw("g.svg")``,
``trace.show("g.html")``).
"""

from torchlens.viz.dot import to_dot
from torchlens.viz.html import op_html, trace_html
from torchlens.viz.render import FORMATS, DrawingSizeWarning, draw
from torchlens.viz.viewer import ViewerPage, show, viewer_html

__all__ = [
    "FORMATS",
    "DrawingSizeWarning",
    "ViewerPage",
    "draw",
    "op_html",
    "show",
    "to_dot",
    "trace_html",
    "viewer_html",
]
