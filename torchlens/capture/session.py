"""A capture session: the function mode plus module followers, alive only inside ``with``.

Everything a session installs is removed in ``__exit__``, whatever the forward did. A
thread-local marker refuses a second capture started from inside a running one, and
:func:`suspended` lets code (such as ``reference_output``) run the model on pristine torch
in the middle of a capture.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import torch
from torch.overrides import _get_current_function_mode_stack

from torchlens._gc import collector_paused
from torchlens.capture.builder import TraceBuilder
from torchlens.capture.failures import trim_torchlens_frames
from torchlens.capture.hooks import ModuleCalls, ModuleTracker
from torchlens.capture.mode import CaptureMode, OpHook
from torchlens.capture.roots import Root
from torchlens.errors import ReentrantCaptureError

__all__ = [
    "CaptureSession",
    "active_session",
    "collector_paused",
    "refuse_reentry",
    "suspended",
]

_local = threading.local()


def active_session() -> CaptureSession | None:
    """The capture session running in this thread, if any."""
    return getattr(_local, "session", None)


def refuse_reentry() -> None:
    """Raise :class:`ReentrantCaptureError` if this thread is inside a capture already."""
    if active_session() is not None:
        raise ReentrantCaptureError(
            "tl.trace was called from inside a forward that is already being traced; "
            "trace the outer model once, or call tl.trace after the outer capture ends",
        )


class CaptureSession:
    """Install capture on the modules of ``root`` for the duration of a ``with`` block."""

    def __init__(self, builder: TraceBuilder, op_hooks: tuple[OpHook, ...], root: Root) -> None:
        self.root = root  # (capture/roots.py)
        self.builder = builder
        self.mode = CaptureMode(builder, op_hooks)
        self.tracker = ModuleTracker()  # its module calls
        self._stack = ExitStack()

    def __enter__(self) -> CaptureSession:
        refuse_reentry()
        with ExitStack() as stack:
            _local.session = self
            stack.callback(_clear_session)
            stack.callback(self.tracker.exit)
            calls = ModuleCalls(self.builder, self.tracker)
            self.tracker.enter(self.root, calls, self.builder.add_modules)
            stack.enter_context(self.mode)
            self._stack = stack.pop_all()
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        trim_torchlens_frames(exc)  # a model's error then ends at the model's line
        self._stack.close()  # (a wrapper still called after, below another thread's, passes)


def _clear_session() -> None:
    _local.session = None


@contextmanager
def suspended() -> Iterator[None]:
    """Run a block with this thread's capture (function mode and hooks) switched off."""
    session = active_session()
    if session is None:
        yield
        return
    popped = []
    if any(m is session.mode for m in _get_current_function_mode_stack()):
        while torch._C._len_torch_function_stack() > 0:
            mode = torch._C._pop_torch_function_stack()
            popped.append(mode)
            if mode is session.mode:
                break
    _local.session = None
    try:
        with session.tracker.suspended():
            yield
    finally:
        _local.session = session
        for mode in reversed(popped):
            torch._C._push_on_torch_function_stack(mode)
