"""An interactive graph viewer: one self-contained HTML page per trace.

The page carries its data, script and style inline (nothing is fetched at view time, no CDN),
lays the graph out top to bottom, and unfolds module calls on click. Graphviz, where it is
installed, orders the branches; the page places the boxes itself so that a group unfolds
without another round trip, and lays out only what is unfolded, so 10,000 ops stay fluid.
"""

from __future__ import annotations

import json
import os
import tempfile
from html import escape
from importlib.resources import files
from pathlib import Path
from typing import Any

from torchlens.errors import InvalidArgumentError
from torchlens.trace import Trace
from torchlens.viz._viewer_data import viewer_data

__all__ = ["ViewerPage", "show", "viewer_html"]


class ViewerPage:
    """A written viewer page: its ``path``, and an inline view in notebooks.

    ``os.fspath(page)`` is the path, so a page can be passed wherever a path is expected.

    Example:
        >>> import os, torch, torchlens as tl, tempfile, pathlib
        >>> trace = tl.trace(torch.nn.ReLU(), torch.randn(2, 3))
        >>> page = trace.show(pathlib.Path(tempfile.mkdtemp()) / "relu.html")
        >>> os.fspath(page).endswith("relu.html"), page._repr_html_().startswith("<iframe")
        (True, True)
    """

    def __init__(self, path: Path, height: int = 640) -> None:
        self.path = path
        self.height = height

    def __fspath__(self) -> str:
        return str(self.path)

    def __repr__(self) -> str:
        return f"<ViewerPage {self.path}>"

    def _repr_html_(self) -> str:
        page = self.path.read_text(encoding="utf-8")
        return (
            f'<iframe srcdoc="{escape(page, quote=True)}" style="width:100%;'
            f'height:{self.height}px;border:1px solid #ccd" sandbox="allow-scripts"></iframe>'
        )


def show(
    trace: Trace,
    path: str | os.PathLike[str] | None = None,
    *,
    status: Any = None,
    open: bool = False,
    values: int = 0,
    rolled: bool = False,
) -> ViewerPage:
    """Write the trace as an interactive, self-contained HTML page (and open it if asked).

    The page shows the graph top to bottom with module calls as boxes that unfold on click
    (they start folded to a readable size), runs of identical calls folded with a count, pan
    and zoom (mouse, arrow keys, ``+``/``-``, ``0`` to fit), and a search box over labels,
    functions and module addresses. Clicking an op opens a panel with its fields, its call,
    and summary statistics and a histogram of its saved value.

    Args:
        trace: what to show.
        path: the ``.html`` file to write; ``None`` writes one in a temporary directory.
        status: a :class:`~torchlens.replay.ReplayStatus` (``tl.replay(...)``): each op is
            coloured by its verdict (passed, failed, unverified), folded groups by their worst.
        open: open the page in the default web browser.
        values: embed the first ``values`` elements of each saved value (``0``: none, so the
            file size follows the number of ops, not the size of the activations).
        rolled: open in the rolled view: each layer (``trace.layers``, the same code run
            again) drawn once with its pass count, the edges between passes labelled. The
            page's *Rolled* / *Unrolled* button (shown when some layer repeats) switches.

    Returns:
        A :class:`ViewerPage`; in a notebook it renders the page inline.

    Raises:
        InvalidArgumentError: ``bad_option`` for a path not ending in ``.html``, a negative
            ``values`` or a ``status`` that is not a ReplayStatus.

    Example:
        >>> import torch, torchlens as tl, tempfile, pathlib
        >>> trace = tl.trace(torch.nn.Sequential(torch.nn.Linear(4, 3)), torch.randn(2, 4))
        >>> page = show(trace, pathlib.Path(tempfile.mkdtemp()) / "graph.html")
        >>> page.path.read_text().count("<script src=")
        0
    """
    target = _target(path)
    text = viewer_html(trace, status=status, values=values, rolled=rolled)
    target.write_text(text, encoding="utf-8")
    if open:
        import webbrowser  # only when asked: it looks for a browser on import

        webbrowser.open(target.resolve().as_uri())
    return ViewerPage(target)


def viewer_html(trace: Trace, *, status: Any = None, values: int = 0, rolled: bool = False) -> str:
    """The viewer page as a string; see :func:`show` for the arguments.

    Returns:
        The whole page: data, script and style inline.

    Raises:
        InvalidArgumentError: ``bad_option`` for a negative ``values`` or a ``status`` that
            is not a ReplayStatus.

    Example:
        >>> import torch, torchlens as tl
        >>> html = viewer_html(tl.trace(torch.nn.ReLU(), torch.randn(2, 3)))
        >>> html.startswith("<!DOCTYPE html>") and "relu_1" in html
        True
    """
    if not isinstance(values, int) or isinstance(values, bool) or values < 0:
        raise InvalidArgumentError(
            f"values must be an int >= 0 (how many elements of each value to embed), "
            f"got {values!r}",
            code="bad_option",
        )
    if status is not None and not hasattr(status, "failures"):
        raise InvalidArgumentError(
            f"status must be a ReplayStatus, as tl.replay(model, args) returns, got "
            f"{type(status).__name__}",
            code="bad_option",
        )
    data = viewer_data(trace, status=status, values=values)
    data["start_rolled"] = bool(rolled)
    payload = json.dumps(data, separators=(",", ":"), ensure_ascii=True)
    payload = payload.replace("</", "<\\/")  # a label can never close the script element
    assets = files("torchlens.viz") / "viewer_assets"
    template = (assets / "viewer.html").read_text(encoding="utf-8")
    parts = {
        "__TITLE__": escape(f"{data['title']} - torchlens"),
        "__STYLE__": (assets / "viewer.css").read_text(encoding="utf-8"),
        "__SCRIPT__": "\n".join(
            (assets / name).read_text(encoding="utf-8")
            for name in ("panel.js", "route.js", "fit.js", "viewer.js")
        ),
        "__DATA__": payload,
    }
    for key, value in parts.items():
        head, _, tail = template.partition(key)
        template = head + value + tail
    return template


def _target(path: str | os.PathLike[str] | None) -> Path:
    if path is None:
        folder = Path(tempfile.mkdtemp(prefix="torchlens-"))
        return folder / "trace.html"
    target = Path(path)
    if target.suffix.lower() not in (".html", ".htm"):
        raise InvalidArgumentError(
            f"show writes an HTML page: give a path ending in .html, got {str(target)!r}",
            code="bad_option",
        )
    return target
