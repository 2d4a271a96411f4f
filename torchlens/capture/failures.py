"""When the model itself raises during a capture: keep its error, say where, hide our frames.

The exception a model raises (a wrong dtype, a wrong channel count) is the model's, and the
user's ``except`` clauses are written for its type, so it is never wrapped. Two things are
added: a note (``BaseException.add_note``, Python 3.11+) naming the op about to be recorded
and its module call, and a traceback without torchlens's own frames, so the last frame shown
is the model's line that made the call. Frames are removed only from exceptions raised by the
model's call itself; a bug inside torchlens keeps its full traceback.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import TracebackType
from typing import Any

from torchlens.capture.source import is_library_file
from torchlens.errors import TorchLensError

__all__ = [
    "attach_partial_trace",
    "note_model_error",
    "trim_torchlens_frames",
]

_PACKAGE = str(Path(__file__).resolve().parents[1]) + os.sep  # .../torchlens/
_MARK = "__torchlens_op__"  # set on an exception the model's call raised during capture
_WHERE = "__torchlens_call__"  # the module call ("layers.0:1", "" for the root) it ran in


def note_model_error(err: BaseException, builder: Any, func_name: str) -> None:
    """Mark ``err`` as the model's and note the op and module call it was raised in
    (``tl.trace``'s builder counts labels and keeps the module stack).

    Called only on the error path, so it costs the capture nothing per op.
    """
    label = builder.labeler.peek(func_name)  # its would-be label
    stack = builder.module_stack
    if getattr(err, _MARK, None) is not None or isinstance(err, TorchLensError):
        return
    where = "the traced model's own forward"
    call_name = ""
    if stack:
        address, call = stack[-1]
        where = f"{address}" + (f" (call {call})" if call > 1 else "")
        call_name = f"{address}:{call}"
    note = (
        f"while running {label} in {where}: this error comes from the model's code, not "
        "from torchlens; run the model without tl.trace to see the same error"
    )
    try:
        setattr(err, _MARK, label)
        setattr(err, _WHERE, call_name)
    except AttributeError:  # an exception type with __slots__ cannot be marked or noted
        return
    if hasattr(err, "add_note"):
        err.add_note(note)
    else:  # Python 3.10: no notes in tracebacks; keep it where 3.11+ would put it
        err.__notes__ = [*getattr(err, "__notes__", []), note]


def trim_torchlens_frames(err: BaseException) -> None:
    """Drop torchlens's frames from a model error's traceback (the first frame stays: it is
    where the exception is passing through now, and Python re-adds it anyway)."""
    head = err.__traceback__
    if head is None or getattr(err, _MARK, None) is None:
        return
    kept: list[TracebackType] = [head]
    tb = head.tb_next
    while tb is not None:
        if not tb.tb_frame.f_code.co_filename.startswith(_PACKAGE):
            kept.append(tb)
        tb = tb.tb_next
    for before, after in zip(kept, [*kept[1:], None]):
        before.tb_next = after


def attach_partial_trace(
    err: BaseException, builder: Any, root_type: str, rng_state: Any, meta: dict[str, Any]
) -> None:
    """Hang the trace of the ops recorded before the model raised on ``err.partial_trace``.

    Its ``meta`` says ``partial=True`` and names the call that raised: ``failed_call`` is
    the label that call's output would have had (``None`` when the error was raised by
    Python code, not by a torch call) and ``failed_in`` its module call (``"layers.0:1"``,
    ``""`` for the root). Building it must never hide the model's error, so any failure
    here leaves ``err`` as it was.
    """
    try:
        label = getattr(err, _MARK, None)
        where = getattr(err, _WHERE, "") if label is not None else _raised_in(err, builder)
        notes = {
            "partial": True,
            "failed_call": label,
            "failed_in": where,
            "error": f"{type(err).__name__}: {err}",
        }
        trace = builder.finish(root_type, None, [], rng_state=rng_state, meta={**meta, **notes})
        err.partial_trace = trace  # type: ignore[attr-defined]
    except Exception:  # an exception type that takes no attributes, or a broken recording
        return


def _raised_in(err: BaseException, builder: Any) -> str:
    """The module call whose Python code raised ``err``, from its traceback (the module
    hooks have closed every call by now); ``""`` for the traced model itself."""
    addresses = {id(module): address for address, module in builder.named_modules if address}
    address = ""
    tb = err.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        # only the model's own methods: reading the locals of a frame still running (ours)
        # would store them on it, and they hold the error, a cycle that keeps values alive
        if code.co_argcount and code.co_varnames[0] == "self":
            if not is_library_file(code.co_filename):
                address = addresses.get(id(tb.tb_frame.f_locals.get("self")), address)
        tb = tb.tb_next
    if not address:
        return ""
    call = max((c.call_index for c in builder.stack.calls if c.address == address), default=1)
    return f"{address}:{call}"
