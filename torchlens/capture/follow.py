"""Module calls the per-instance wrappers do not cover, followed on the capture's thread.

The wrappers of ``capture/hooks.py`` follow the modules a capture knows before its forward
(its root's). A traced bound method or function can call others (a closure's UNet, a
module built during the forward), and those must be recorded too. While any capture runs,
``nn.Module.__call__`` is replaced by :func:`_followed_call`, which hands a call to the
:class:`Follower` of the calling thread, if any, unless the follower skips that module
(it is wrapped already, or its call is the capture itself); every other call (other
threads, no capture, a known module) goes straight on to torch's ``__call__``.

Why not torch's global module hooks (``register_module_forward_pre_hook``)? Their presence
sends *every* module call down ``Module._call_impl``'s slow path: about 2 us more per call
of a known module, where this costs about 0.3 us (one frame, a thread-local read, a set
lookup). ``torch.fx`` replaces ``Module.__call__`` during symbolic tracing the same way.
The replacement is counted: the first capture to start installs it, the last to end puts
torch's back, on every exit path. A module class with a ``__call__`` of its own is not
followed (its calls are still recorded as ops, outside any module call).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial
from typing import Any

from torch import nn

from torchlens.capture.roots import ModuleNames

__all__ = ["Follower"]

_local = threading.local()
_lock = threading.Lock()
_count = 0  # captures following now
_torch_call: Callable[..., Any] = nn.Module.__call__  # torch's, taken again at each install

# (module, address, the call or forward to make) -> the one that records it (hooks.py's too)
CallFactory = Callable[[nn.Module, str, Callable[..., Any]], Callable[..., Any]]


def _followed_call(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """``nn.Module.__call__`` while a capture runs (see the module docstring)."""
    follower = _local.__dict__.get("follower")
    if follower is None or id(self) in follower.skip:
        return _torch_call(self, *args, **kwargs)
    return follower.call(self, args, kwargs)


class Follower:
    """Follows, for one capture on this thread, the calls of modules nobody wraps.

    Args:
        names: the capture's :class:`~torchlens.capture.roots.ModuleNames`.
        factory: makes the recording call of a module (as ``hooks.ForwardWrap``'s).
        skip: ids of the modules not to follow (wrapped already, or the traced module).
        owner: the capture's :class:`~torchlens.capture.hooks.ModuleTracker`: calls pass
            straight through while it is not on.
        on_new: called with the ``(address, module)`` pairs each newly named module adds.
    """

    def __init__(
        self,
        names: ModuleNames,
        factory: CallFactory,
        skip: set[int],
        owner: Any,
        on_new: Callable[[list[tuple[str, nn.Module]]], None] | None = None,
    ) -> None:
        self.names = names
        self.factory = factory
        self.skip = skip
        self.owner = owner
        self.on_new = on_new
        self._calls: dict[int, tuple[nn.Module, Callable[..., Any]]] = {}
        self._on = False

    def call(self, module: nn.Module, args: tuple, kwargs: dict) -> Any:
        """Run ``module(*args, **kwargs)`` recorded as a call at its address."""
        torch_call = _torch_call
        if not self.owner.on:
            return torch_call(module, *args, **kwargs)
        entry = self._calls.get(id(module))
        if entry is None:
            address, new = self.names.name(module)
            if new and self.on_new is not None:
                self.on_new(new)
            entry = (module, self.factory(module, address, partial(torch_call, module)))
            self._calls[id(module)] = entry  # (the module held: its id stays its own)
        return entry[1](*args, **kwargs)

    def install(self) -> Follower:
        """Start following on this thread; :meth:`remove` ends it."""
        global _count, _torch_call
        with _lock:
            if _count == 0 and nn.Module.__dict__.get("__call__") is not _followed_call:
                _torch_call = nn.Module.__call__
                nn.Module.__call__ = _followed_call
            _count += 1
        self._on = True
        _local.follower = self
        return self

    def remove(self) -> None:
        """Stop following (once, whatever the path out of the capture)."""
        if not self._on:
            return
        self._on = False
        if _local.__dict__.get("follower") is self:
            _local.follower = None
        global _count
        with _lock:
            _count -= 1
            if _count == 0 and nn.Module.__dict__.get("__call__") is _followed_call:
                nn.Module.__call__ = _torch_call  # (kept: a call of another thread may be
                # between reading it and making the call)
        self._calls.clear()
