"""A readable default for big drawings: fold repeats, then collapse module calls by depth.

The rule (documented in ``docs/drawing.md``): when the caller left ``depth`` at ``"auto"``
and picked no ``collapse_repeats``, and the full graph would have more than ``max_nodes``
boxes or be more than :data:`MAX_ROWS` boxes tall (the longest chain of boxes from top to
bottom: a strip far taller than a screen), the drawing folds repeated blocks; if that is
still too big, it collapses module calls to the deepest depth that fits (down to
``depth=0``). One warning line says what was chosen and that ``depth=None`` draws the full
graph.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import Any

from torchlens.errors import InvalidArgumentError
from torchlens.viz.graph import View, build_view

__all__ = ["AUTO", "MAX_NODES", "MAX_ROWS", "DrawingSizeWarning", "readable_options", "rows"]

AUTO = "auto"  # the default depth: the full graph when it is readable, a smaller one if not
MAX_NODES = 150  # boxes past which a default drawing stops being readable on a screen
# boxes in a chain from top to bottom past which a drawing is a strip far taller than a
# screen: Graphviz gives each row about 0.8 inch with its gap, so 40 rows are about three
# screens (a 2-layer GPT-2 drawn in full is 82 rows)
MAX_ROWS = 40


class DrawingSizeWarning(UserWarning):
    """A big graph was drawn with a smaller default (folded repeats, a depth)."""


def rows(view: View) -> int:
    """How many boxes the longest top-to-bottom chain of ``view`` has (Graphviz's ranks).

    Example:
        >>> import torch, torchlens as tl
        >>> trace = tl.trace(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU()),
        ...                  torch.randn(1, 2))
        >>> rows(build_view(trace))  # input, linear, relu, output
        4
    """
    preds: dict[str, list[str]] = {}
    for a, b in view.edges:
        preds.setdefault(b, []).append(a)
    chain: dict[str, int] = {}
    for node in view.nodes:  # in trace order: an edge back to a later box is not a row
        chain[node] = 1 + max((chain[p] for p in preds.get(node, ()) if p in chain), default=0)
    return max(chain.values(), default=0)


def readable_options(
    trace: Any,
    depth: int | str | None,
    collapse_repeats: bool,
    params: str,
    max_nodes: int | None,
    rolled: bool = False,
) -> tuple[int | None, bool]:
    """``(depth, collapse_repeats)`` to draw with: the caller's, or a readable default
    (``rolled`` drawings are measured rolled, and only collapsed by depth).

    Raises:
        InvalidArgumentError: ``bad_option`` when ``max_nodes`` is not None or an int >= 1;
            ``bad_depth`` for a depth that is not ``"auto"``, None or an int >= 0.
    """
    if max_nodes is not None and (not isinstance(max_nodes, int) or max_nodes < 1):
        raise InvalidArgumentError(
            f"max_nodes must be None (always draw the full graph) or an int >= 1, "
            f"got {max_nodes!r}",
            code="bad_option",
        )
    if isinstance(depth, str) and depth != AUTO:
        raise InvalidArgumentError(
            f"depth must be 'auto' (the default: a readable size), None (every module call) "
            f"or an int >= 0, got {depth!r}",
            code="bad_depth",
        )
    if depth != AUTO or max_nodes is None or collapse_repeats:
        return (None if depth == AUTO else depth), collapse_repeats
    full = build_view(trace, params=params, rolled=rolled)
    size = (len(full.nodes), rows(full))
    if size[0] <= max_nodes and size[1] <= MAX_ROWS:
        return None, False
    deepest = max((len(op.module_stack) for op in trace.ops), default=0)
    choice, smaller = (None, not rolled), size
    for candidate in (None, *range(deepest - 1, -1, -1))[int(rolled) :]:
        view = build_view(trace, candidate, not rolled, params, rolled)
        choice, smaller = (candidate, not rolled), (len(view.nodes), rows(view))
        if smaller[0] <= max_nodes and smaller[1] <= MAX_ROWS:
            break
    depth_text = "" if choice[0] is None else f", depth={choice[0]}"
    warnings.warn(
        f"the full graph has {size[0]} boxes in {size[1]} rows (readable: at most "
        f"max_nodes={max_nodes} boxes and {MAX_ROWS} rows), so it was drawn with "
        f"{'rolled=True' if rolled else 'collapse_repeats=True'}{depth_text} "
        f"({smaller[0]} boxes in {smaller[1]} rows); pass "
        "depth=None (or max_nodes=None) to draw every op",
        DrawingSizeWarning,
        stacklevel=_caller_level(),
    )
    return choice


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside torchlens (the user's draw call)."""
    package = str(Path(__file__).resolve().parents[1]) + os.sep
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    return level
