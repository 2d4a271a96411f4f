"""Render DOT text to SVG, PNG or PDF with the Graphviz ``dot`` program.

The ``dot`` program is a system package, not a Python one, so it may be missing even where
``pip install torchlens`` succeeded: :func:`draw` then raises
:class:`~torchlens.errors.GraphvizMissingError` saying how to install it, and
:func:`~torchlens.viz.to_dot` keeps working.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from torchlens.errors import GraphvizMissingError, InvalidArgumentError
from torchlens.trace import Trace
from torchlens.viz.dot import to_dot
from torchlens.viz.readable import AUTO, MAX_NODES, DrawingSizeWarning, readable_options

__all__ = ["FORMATS", "DrawingSizeWarning", "draw", "render_dot"]

FORMATS = ("svg", "png", "pdf")
_INSTALL_HINT = (
    "install Graphviz's `dot` program: `apt-get install graphviz` (Debian/Ubuntu), "
    "`brew install graphviz` (macOS) or `conda install -c conda-forge graphviz`; "
    "trace.to_dot() works without it"
)


def draw(
    trace: Trace,
    path: str | os.PathLike[str],
    *,
    format: str | None = None,
    depth: int | str | None = AUTO,
    collapse_repeats: bool = False,
    params: str = "fold",
    rankdir: str = "TB",
    max_nodes: int | None = MAX_NODES,
    rolled: bool = False,
) -> Path:
    """Draw the trace's graph to ``path`` as SVG, PNG or PDF.

    Args:
        trace: what to draw.
        path: the file to write; its suffix (``.svg``, ``.png``, ``.pdf``) picks the format.
        format: the format, when the suffix should not decide.
        depth: as for :func:`torchlens.viz.to_dot` (``None`` draws every module call), or
            ``"auto"``, the default: the full graph, unless it has more than ``max_nodes``
            boxes or is more than 40 boxes tall (``readable.MAX_ROWS``); then repeated
            blocks are folded and module calls collapsed to the deepest depth that fits,
            with a :class:`DrawingSizeWarning` saying so in one line.
        collapse_repeats, params, rankdir: as for :func:`torchlens.viz.to_dot`.
        max_nodes: the most boxes the ``"auto"`` depth draws; ``None`` always draws the
            full graph.
        rolled: draw each layer once with its pass count, as for
            :func:`torchlens.viz.to_dot` (``docs/loops.md``).

    Returns:
        The path written.

    Raises:
        GraphvizMissingError: the ``dot`` program is not installed (code ``graphviz_missing``).
        InvalidArgumentError: unknown format (code ``bad_format``), depth (``bad_depth``)
            or drawing option.

    Example:
        >>> import torch, torchlens as tl, tempfile, pathlib
        >>> trace = tl.trace(torch.nn.Linear(4, 3), torch.randn(2, 4))
        >>> out = pathlib.Path(tempfile.mkdtemp()) / "graph.svg"
        >>> draw(trace, out).read_text().lstrip().startswith("<?xml")  # doctest: +SKIP
        True
    """
    path = Path(path)
    fmt = (format or path.suffix.removeprefix(".")).lower()
    if fmt not in FORMATS:
        raise InvalidArgumentError(
            f"cannot draw to {str(path)!r}: use a .svg, .png or .pdf file, or pass "
            f"format= one of {', '.join(FORMATS)}",
            code="bad_format",
        )
    depth, collapse_repeats = readable_options(
        trace, depth, collapse_repeats, params, max_nodes, rolled=rolled
    )
    text = to_dot(trace, depth, collapse_repeats, params, rankdir, rolled)
    if fmt == "png":  # the 96 dpi default makes small, blurry text
        text = text.replace("digraph torchlens {", 'digraph torchlens {\n  graph [dpi="144"];', 1)
    path.write_bytes(render_dot(text, fmt))
    return path


def render_dot(text: str, fmt: str) -> bytes:
    """Lay out DOT ``text`` with ``dot`` and return the rendered bytes in format ``fmt``."""
    if shutil.which("dot") is None:
        raise GraphvizMissingError(
            f"Graphviz's `dot` program was not found on PATH; {_INSTALL_HINT}"
        )
    try:
        import graphviz
    except ImportError:  # a declared dependency, but environments get trimmed
        raise GraphvizMissingError(
            "the `graphviz` Python package is missing; `pip install graphviz`"
        ) from None
    try:
        return graphviz.pipe("dot", fmt, text.encode("utf-8"), quiet=True)
    except graphviz.ExecutableNotFound as err:
        raise GraphvizMissingError(
            f"Graphviz's `dot` could not run ({err}); {_INSTALL_HINT}"
        ) from None
