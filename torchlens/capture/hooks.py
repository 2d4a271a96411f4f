"""Module hooks that keep the module stack while a capture runs.

Two global hooks (``register_module_forward_pre_hook`` / ``register_module_forward_hook``)
serve every module, whatever the model's size: registering a pair of hooks per submodule
and removing them again cost more than the whole capture of a small layer. The hooks pick
the model's own modules by identity and ignore calls from other threads, so two threads
running the same model never see each other's module calls, and modules outside the model
(one built inside ``forward``) are not module calls of the trace.

A global pre-hook is not given keyword arguments, so a module whose ``forward`` can take
more than its one input (a layer given ``attention_mask=...``) gets a pair of hooks of its
own, which see its keyword arguments as the call begins; so does a module that has hooks of
its own. The many one-input modules (linear, convolution, norm, activation, dropout) are
served by the global pair. Should one of those still be called by keyword
(``linear(input=x)``), its keyword tensors are read when it returns, under the labels they
held when it began (:meth:`TraceBuilder.exit_module`).
"""

from __future__ import annotations

import inspect
import threading
import weakref
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import (
    register_module_forward_hook,
    register_module_forward_pre_hook,
)
from torch.utils.hooks import RemovableHandle

from torchlens.capture.builder import TraceBuilder
from torchlens.capture.tree import fill, flatten

__all__ = ["install_module_hooks", "run_exit_hooks"]

_thread_id = threading.get_ident
_no_torch_function = torch._C.DisableTorchFunction


def install_module_hooks(model: Any, builder: TraceBuilder) -> list[RemovableHandle]:
    """Register the module hooks for ``model``'s submodules; returns their handles.

    A submodule with hooks of its own gets a pair of hooks of its own too, registered after
    its hooks: ops that its pre-hooks run fall before its call, those of its forward hooks
    inside it, and the call returns what those hooks made of the output. So does a
    submodule whose ``forward`` takes more than one input, whose keyword arguments the
    global pre-hook would not see (see the module docstring). Every other submodule is
    served by the two global hooks.
    """
    if not isinstance(model, nn.Module):
        return []
    hooks = _ModuleHooks(builder)
    handles: list[RemovableHandle] = []
    try:
        for module in hooks.hooked:
            handles.append(module.register_forward_pre_hook(hooks.enter_own, with_kwargs=True))
            handles.append(
                module.register_forward_hook(hooks.exit_own, with_kwargs=True, always_call=True)
            )
        handles.append(register_module_forward_pre_hook(hooks.enter))
        handles.append(register_module_forward_hook(hooks.exit, with_kwargs=True, always_call=True))
    except BaseException:
        for handle in handles:
            handle.remove()
        raise
    return handles


class _ModuleHooks:
    """The pre- and post-forward hooks of one capture, bound to its builder."""

    def __init__(self, builder: TraceBuilder) -> None:
        self.builder = builder
        self.addresses: dict[int, str] = {}  # modules served by the global hooks
        self.hooked: list[nn.Module] = []  # modules given hooks of their own
        self.own_addresses: dict[int, str] = {}  # their addresses
        for address, module in builder.named_modules:
            if not address:  # the root's own call is the trace itself
                continue
            if module._forward_pre_hooks or module._forward_hooks or _takes_more(type(module)):
                self.hooked.append(module)
                self.own_addresses[id(module)] = address
            else:
                self.addresses[id(module)] = address
        self.thread = threading.get_ident()

    def _active(self) -> bool:
        return not self.builder.paused and _thread_id() == self.thread

    def enter(self, module: nn.Module, args: tuple) -> None:
        address = self.addresses.get(id(module))
        if address is None or self.builder.paused or _thread_id() != self.thread:
            return  # (the per-module-call path: _active inlined)
        with _no_torch_function():  # bookkeeping must not be recorded as ops
            self.builder.enter_module(module, address, _tensors_in(args))

    def enter_own(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if self._active():
            with _no_torch_function():
                inputs = _tensors_in(args) + _tensors_in(kwargs)
                self.builder.enter_module(module, self.own_addresses[id(module)], inputs)

    def exit(self, module: nn.Module, args: tuple, *rest: Any) -> Any:
        # (kwargs, output), or (output,) when torch calls it after the forward raised
        if id(module) not in self.addresses or self.builder.paused or _thread_id() != self.thread:
            return None
        if len(rest) == 2:
            kwargs, output = rest
            return self._exit(output, _tensors_in(kwargs) if kwargs else ())
        return self._exit(rest[0], ())

    def exit_own(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
        return self._exit(output, ()) if self._active() else None

    def _exit(self, output: Any, late_inputs: Any) -> Any:
        builder = self.builder
        with _no_torch_function():
            tensors = _tensors_in(output)
            call = builder.exit_module(tensors, late_inputs)
            if call is not None and builder.exit_hooks:
                return run_exit_hooks(builder, call, output, tensors)
        return None


_MORE: weakref.WeakKeyDictionary[type, bool] = weakref.WeakKeyDictionary()
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def _takes_more(cls: type) -> bool:
    """Whether ``cls.forward`` takes anything besides one input (more parameters, ``*args``
    or keywords): its calls may pass keyword tensors. Answered once per class."""
    known = _MORE.get(cls)
    if known is None:
        try:
            parameters = list(inspect.signature(cls.forward).parameters.values())
        except (TypeError, ValueError):  # no readable signature: assume it may
            known = True
        else:
            positional = [p for p in parameters if p.kind in _POSITIONAL]
            known = len(positional) != 2 or len(parameters) != 2  # (self, input) only
        _MORE[cls] = known
    return known


def run_exit_hooks(builder: TraceBuilder, call: Any, output: Any, tensors: list) -> Any:
    """Hand a finished call's outputs to ``builder.exit_hooks``; the output with any
    replaced tensors put back in place, or None when none was replaced."""
    new = tensors
    for hook in builder.exit_hooks:
        new = hook(call, new) or new
    if all(a is b for a, b in zip(new, tensors)):
        return None
    if isinstance(output, torch.Tensor):
        return new[0]
    return fill(flatten(output)[1], new)


def _tensors_in(obj: Any) -> list[torch.Tensor]:
    """The tensors inside a hook argument; plain tensors and flat tuples skip the tree walk."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if type(obj) is tuple:
        if len(obj) == 1 and isinstance(obj[0], torch.Tensor):
            return [obj[0]]
        if all(isinstance(item, torch.Tensor) for item in obj):
            return list(obj)
    if obj:
        return [t for _, t in flatten(obj)[0]]
    return []
