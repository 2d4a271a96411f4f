"""Python's cyclic garbage collector paused around allocation-heavy work, as it was after."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["collector_paused"]


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused for a capture, as it was after.

    A capture allocates a few objects per op, which triggers collections that walk every
    object torch holds (~170,000): a fifth of the capture time of a model of small ops.
    Reference counting still frees everything acyclic at once; cycles wait until the end.
    Held over the whole capture, up to the frozen trace, so the bookkeeping that dies with
    the capture (the identity map's weak references) is freed before the collector sees it.
    The grouping of layers (``torchlens/layers.py``) holds it too, for the same reason.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
