"""How a capture follows module calls: each module of its root has its ``forward`` wrapped.

(Modules outside the root, called from a traced method or function or built during the
forward, are followed by ``capture/follow.py``; :meth:`ModuleTracker.enter` installs both.)

The wrapper is an attribute of the module instance (``module.__dict__["forward"]``), which
``nn.Module.__call__`` finds before the class's ``forward``; it is removed again on every
exit path, and whatever instance ``forward`` the module had before is put back. A module
without hooks keeps torch's fast call path (no hook dispatch at all), and the wrapper sees
the call's positional and keyword arguments alike, so ``layer(x, attention_mask=m)`` names
``m`` as an input when the call begins. Registering hooks (a pair per module, or torch's
global ones) cost more than the whole capture of a small layer. The owner of a traced
method is wrapped too: its calls (one per decoding step of ``generate``) are calls of ``""``.

A module that has hooks of its own gets a pair of hooks instead, registered after its
hooks: ops that its pre-hooks run fall before its call, those of its forward hooks inside
it, and the call returns what those hooks made of the output, as the model sees it.

Calls from other threads, and calls while the capture is suspended, pass straight through:
two threads running the same model never see each other's module calls. One
:class:`ModuleTracker` per capture installs all of these and removes them again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from torchlens.capture.follow import CallFactory, Follower
from torchlens.capture.roots import ModuleNames, Root
from torchlens.capture.tree import fill, flatten

if TYPE_CHECKING:
    from torchlens.capture.builder import TraceBuilder

__all__ = [
    "ForwardWrap",
    "ModuleCalls",
    "ModuleTracker",
    "run_exit_hooks",
]

_thread_id = threading.get_ident
_no_torch_function = torch._C.DisableTorchFunction


class ForwardWrap:
    """A module's ``forward`` wrapped for one capture; :meth:`remove` puts it back.

    Two threads capturing the same model at once wrap one module twice, and may finish in
    either order: a wrapper removed while another lies above it is only marked removed,
    and the one above, when removed, puts back what lay below both.
    """

    __slots__ = ("module", "wrapper", "before")

    def __init__(self, module: nn.Module, factory: CallFactory, address: str) -> None:
        self.module = module
        self.before = module.__dict__.get("forward")  # an instance forward of its own, if any
        forward = module.forward
        wrapper = self.wrapper = factory(module, address, forward)
        wrapper.__wrapped__ = forward  # inspect.signature sees the real one
        if self.before is not None:  # for the unwinding (an attribute of the function: no
            wrapper._torchlens_below = self.before  # reference cycle to the module)
        module.__dict__["forward"] = wrapper

    def remove(self) -> None:
        attributes = self.module.__dict__
        if attributes.get("forward") is not self.wrapper:
            # another capture's wrapper lies above (it unwinds past this one later), or the
            # model assigned a forward of its own meanwhile: that one stays
            self.wrapper._torchlens_removed = True
            return
        below = self.before
        while getattr(below, "_torchlens_removed", False):
            below = getattr(below, "_torchlens_below", None)
        if below is None:
            del attributes["forward"]
        else:
            attributes["forward"] = below


class ModuleTracker:
    """Follows the module calls of one capture, whatever its policy (``tl.trace``,
    ``tl.record``, ``tl.extract``, ``find_nonfinite``): :meth:`enter` installs every
    mechanism it needs (forward wrappers, hook pairs, the follower of modules outside the
    root), :meth:`exit` removes them all, on every exit path. The wrappers record only
    while :attr:`on` holds, on the thread that made the tracker: before :meth:`enter`,
    after :meth:`exit` and inside :meth:`suspended` every call passes straight through."""

    __slots__ = ("on", "thread", "_done")

    def __init__(self) -> None:
        self.on = False
        self.thread = _thread_id()
        self._done: list[ForwardWrap | RemovableHandle | Follower] = []

    def enter(
        self,
        root: Root,
        calls: Any,
        on_new: Callable[[list[tuple[str, nn.Module]]], None] | None,
    ) -> None:
        """Follow the calls of ``root`` (its walk made once, for the whole capture; a
        traced module's own call is the capture itself, but the owner of a traced method
        is called inside it): ``calls.traced_forward`` makes each wrapped forward, and a
        module with hooks of its own gets ``calls.enter_own`` (called with its address
        first) and ``calls.exit_own`` as hooks (see the module docstring). Unless the
        traced callable is a module itself, every other module call on this thread goes
        to the same factory (a :class:`~torchlens.capture.follow.Follower`); ``on_new`` is
        told the modules first named during the forward."""
        done: list[ForwardWrap | RemovableHandle | Follower] = []
        try:
            for address, module in root.modules:
                if not address and root.itself is not None:
                    continue
                if module._forward_pre_hooks or module._forward_hooks:
                    enter = partial(calls.enter_own, address)
                    done.append(module.register_forward_pre_hook(enter, with_kwargs=True))
                    done.append(
                        module.register_forward_hook(
                            calls.exit_own, with_kwargs=True, always_call=True
                        )
                    )
                else:
                    done.append(ForwardWrap(module, calls.traced_forward, address))
        except BaseException:
            for item in reversed(done):
                item.remove()
            raise
        self._done = done
        if root.itself is None:
            # (a traced module: its tree is wrapped, and nothing else is followed.
            # Following costs every module call of the forward about 5 us inside a capture,
            # measured on 200 Linear+ReLU calls: 7.5 -> 8.4 ms, more than the wrappers)
            skip = {id(module) for _, module in root.modules}
            follower = Follower(ModuleNames(root), calls.traced_forward, skip, self, on_new)
            self._done.append(follower.install())
        self.on = True

    def exit(self) -> None:
        """Stop following and remove everything :meth:`enter` installed."""
        self.on = False
        done, self._done = self._done, []
        for handle in done:
            handle.remove()

    @contextmanager
    def suspended(self) -> Iterator[None]:
        """Let every module call pass through for the block (a reference run)."""
        was, self.on = self.on, False
        try:
            yield
        finally:
            self.on = was


class ModuleCalls:
    """The wrapped forwards and hooks of one capture, bound to its builder (what
    :meth:`ModuleTracker.enter` is given for ``tl.trace``)."""

    def __init__(self, builder: TraceBuilder, tracker: ModuleTracker) -> None:
        self.builder = builder
        self.tracker = tracker
        self.thread = tracker.thread

    def traced_forward(
        self, module: nn.Module, address: str, forward: Callable[..., Any]
    ) -> Callable[..., Any]:
        builder, tracker, thread = self.builder, self.tracker, self.thread
        type_name = type(module).__name__

        def forward_traced(*args: Any, **kwargs: Any) -> Any:
            if not tracker.on or _thread_id() != thread:
                return forward(*args, **kwargs)
            if len(args) == 1 and not kwargs and isinstance(args[0], torch.Tensor):
                inputs = args  # the common one-tensor call, without the walk
            else:
                inputs = _call_inputs(args, kwargs)
            with _no_torch_function():  # bookkeeping must not be recorded as ops
                builder.enter_module(module, address, inputs, type_name)
            try:
                output = forward(*args, **kwargs)
            except BaseException:
                with _no_torch_function():
                    builder.exit_module(())
                raise
            return self._exit(output)

        return forward_traced

    def _active(self) -> bool:
        return self.tracker.on and _thread_id() == self.thread

    def enter_own(self, address: str, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if self._active():
            with _no_torch_function():
                inputs = _call_inputs(args, kwargs)
                self.builder.enter_module(module, address, inputs, type(module).__name__)

    def exit_own(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
        return self._exit(output) if self._active() else None

    def _exit(self, output: Any) -> Any:
        builder = self.builder
        with _no_torch_function():
            tensors = [output] if isinstance(output, torch.Tensor) else _tensors_in(output)
            call = builder.exit_module(tensors)
            if call is not None and builder.exit_hooks:
                return run_exit_hooks(builder, call, output, tensors)
        return output


def run_exit_hooks(builder: TraceBuilder, call: Any, output: Any, tensors: list) -> Any:
    """Hand a finished call's outputs to ``builder.exit_hooks``; the output with any
    replaced tensors put back in place (``output`` itself when none was replaced)."""
    new = tensors
    for hook in builder.exit_hooks:
        new = hook(call, new) or new
    if all(a is b for a, b in zip(new, tensors)):
        return output
    if isinstance(output, torch.Tensor):
        return new[0]
    return fill(flatten(output)[1], new)


def _call_inputs(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensors a module call was given, positional first, then keyword."""
    return _tensors_in(args) + _tensors_in(kwargs) if kwargs else _tensors_in(args)


def _tensors_in(obj: Any) -> list[torch.Tensor]:
    """The tensors inside call arguments or outputs; plain tensors and flat tuples skip the
    tree walk."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if type(obj) is tuple:
        if len(obj) == 1 and isinstance(obj[0], torch.Tensor):
            return [obj[0]]
        if all(isinstance(item, torch.Tensor) for item in obj):
            return list(obj)
    if obj is None or type(obj) in _CONTAINERS and not obj:
        return []  # (no truth test of anything else: a TensorDict or an array refuses one)
    return [t for _, t in flatten(obj)[0]]


_CONTAINERS = (tuple, list, dict)
