"""A readable default for big drawings: fold repeats, then collapse module calls by depth.

The rule (documented in ``docs/drawing.md``): when the caller picked neither ``depth`` nor
``collapse_repeats`` and the full graph would have more than ``max_nodes`` boxes, the drawing
folds repeated blocks; if that is still too many, it collapses module calls to the deepest
depth that fits (down to ``depth=0``). One warning line says what was chosen and that
``max_nodes=None`` draws the full graph.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import Any

from torchlens.errors import InvalidArgumentError
from torchlens.viz.graph import build_view

__all__ = ["MAX_NODES", "DrawingSizeWarning", "readable_options"]

MAX_NODES = 150  # boxes past which a default drawing stops being readable on a screen


class DrawingSizeWarning(UserWarning):
    """A big graph was drawn with a smaller default (folded repeats, a depth)."""


def readable_options(
    trace: Any, depth: int | None, collapse_repeats: bool, params: str, max_nodes: int | None
) -> tuple[int | None, bool]:
    """``(depth, collapse_repeats)`` to draw with: the caller's, or a readable default.

    Raises:
        InvalidArgumentError: ``bad_option`` when ``max_nodes`` is not None or an int >= 1.
    """
    if max_nodes is not None and (not isinstance(max_nodes, int) or max_nodes < 1):
        raise InvalidArgumentError(
            f"max_nodes must be None (always draw the full graph) or an int >= 1, "
            f"got {max_nodes!r}",
            code="bad_option",
        )
    if max_nodes is None or depth is not None or collapse_repeats:
        return depth, collapse_repeats
    full = len(build_view(trace, params=params).nodes)
    if full <= max_nodes:
        return depth, collapse_repeats
    deepest = max((len(op.module_stack) for op in trace.ops), default=0)
    choice, size = (None, True), 0
    for candidate in (None, *range(deepest - 1, -1, -1)):
        size = len(build_view(trace, candidate, True, params).nodes)
        choice = (candidate, True)
        if size <= max_nodes:
            break
    depth_text = "" if choice[0] is None else f", depth={choice[0]}"
    warnings.warn(
        f"the full graph has {full} boxes (more than max_nodes={max_nodes}), so it was drawn "
        f"with collapse_repeats=True{depth_text} ({size} boxes); pass max_nodes=None to draw "
        "every op",
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
