"""A capture session: the function mode plus module followers, alive only inside ``with``.

Everything a session installs is removed at the end of its block, whatever the forward
did. A thread-local marker refuses a second capture started from inside a running one
(``tl.trace``'s and ``tl.record``'s alike: :func:`running`), and :func:`suspended` lets code
(such as ``reference_output``) run the model on pristine torch in the middle of a capture.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack

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
    "capture_session",
    "collector_paused",
    "refuse_reentry",
    "running",
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
    """This thread's running capture as :func:`suspended` sees it: its function mode and
    the tracker of its module calls."""

    def __init__(self, mode: TorchFunctionMode, tracker: ModuleTracker) -> None:
        self.mode = mode
        self.tracker = tracker


@contextmanager
def capture_session(
    builder: TraceBuilder, op_hooks: tuple[OpHook, ...], root: Root
) -> Iterator[None]:
    """Install capture on the modules of ``root`` (``capture/roots.py``) for the block."""
    refuse_reentry()
    mode, tracker = CaptureMode(builder, op_hooks), ModuleTracker()
    with running(CaptureSession(mode, tracker)):
        tracker.enter(root, ModuleCalls(builder, tracker), builder.add_modules)
        with mode:
            yield


@contextmanager
def running(session: CaptureSession) -> Iterator[None]:
    """Run a block as this thread's capture ``session``. At its end, on every path, the
    tracker removes all it installed (a wrapper still called after, below another
    thread's, passes), and a model's error then ends at the model's line."""
    _local.session = session
    try:
        yield
    except BaseException as err:
        trim_torchlens_frames(err)
        raise
    finally:
        session.tracker.exit()
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
