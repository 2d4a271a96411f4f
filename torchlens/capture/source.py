"""``tl.trace(..., source=True)``: note the model's line that made each op.

An op hook (see :class:`~torchlens.capture.mode.CaptureMode`) walks the Python stack from
the hook up to the first frame whose file is neither torch's nor torchlens's: that is the
user's line that called the torch function (a model's ``forward``, or a helper it calls).
The hook is installed only when asked for, so a capture without ``source=True`` pays
nothing. What it stores, ``op.meta["source"] = (file, line, function)``, is plain data and
is saved to disk with the trace.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import torch

__all__ = ["make_source_hook", "caller_frame", "caller_line", "is_library_file"]

_SKIPPED = tuple(
    dict.fromkeys(
        str(path) + os.sep
        for root in (Path(torch.__file__).parent, Path(__file__).parents[1])  # torch, torchlens
        for path in (root, root.resolve())
    )
)


def is_library_file(filename: str) -> bool:
    """Whether ``filename`` is one of torch's or torchlens's own files."""
    return filename.startswith(_SKIPPED)


def caller_frame(depth: int = 1) -> FrameType | None:
    """The first frame above this one, ``depth`` frames up or more, that is outside torch
    and torchlens (the model's code); ``None`` when there is none."""
    frame = sys._getframe(depth)
    while frame is not None and frame.f_code.co_filename.startswith(_SKIPPED):
        frame = frame.f_back
    return frame


def caller_line(depth: int = 1) -> tuple[str, int, str] | None:
    """``(file, line, function)`` of :func:`caller_frame` (``depth`` counted from here)."""
    frame = caller_frame(depth + 1)
    if frame is None:
        return None
    code = frame.f_code
    return code.co_filename, frame.f_lineno, code.co_name


def make_source_hook() -> Any:
    """The op hook that stores the calling line in ``op.meta["source"]``; the outputs of
    one multi-output call share the line found for the first."""
    last: list[Any] = [None, None]  # call_index, line

    def source_hook(op: Any, tensor: torch.Tensor) -> None:
        if op.call_index != last[0]:
            last[0], last[1] = op.call_index, caller_line(2)
        if last[1] is not None:
            op.meta["source"] = last[1]

    return source_hook
