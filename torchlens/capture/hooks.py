"""Per-model forward hooks that keep the module stack while a capture runs.

Hooks are registered on every submodule for the duration of one capture and handed back as
removable handles. They ignore calls from other threads, so two threads running the same model
never see each other's module calls.
"""

from __future__ import annotations

import threading
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from torchlens.capture.builder import TraceBuilder
from torchlens.capture.tree import fill, flatten

__all__ = ["install_module_hooks", "run_exit_hooks"]


def install_module_hooks(model: Any, builder: TraceBuilder) -> list[RemovableHandle]:
    """Register pre/post forward hooks on each submodule of ``model``; returns the handles."""
    if not isinstance(model, nn.Module):
        return []
    thread = threading.get_ident()
    handles: list[RemovableHandle] = []
    try:
        for address, module in builder.named_modules:
            if not address:  # the root's own call is the trace itself
                continue
            pre = partial(_enter, builder, address, thread)
            post = partial(_exit, builder, thread)
            handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
            handles.append(module.register_forward_hook(post, with_kwargs=True, always_call=True))
    except BaseException:
        for handle in handles:
            handle.remove()
        raise
    return handles


def _enter(builder: TraceBuilder, address: str, thread: int, module, args, kwargs) -> None:
    if threading.get_ident() != thread or builder.paused:
        return
    with torch._C.DisableTorchFunction():  # bookkeeping must not be recorded as ops
        builder.enter_module(module, address, _tensors_in(args, kwargs))


def _exit(builder: TraceBuilder, thread: int, module, args, kwargs, output) -> Any:
    if threading.get_ident() != thread or builder.paused:
        return None
    with torch._C.DisableTorchFunction():
        tensors = _tensors_in(output)
        call = builder.exit_module(tensors)
        if call is not None and builder.exit_hooks:
            return run_exit_hooks(builder, call, output, tensors)
    return None


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


def _tensors_in(*objs: Any) -> list[torch.Tensor]:
    """The tensors inside hook arguments; plain tensors and flat tuples skip the tree walk."""
    found: list[torch.Tensor] = []
    for obj in objs:
        if isinstance(obj, torch.Tensor):
            found.append(obj)
        elif type(obj) is tuple and all(isinstance(item, torch.Tensor) for item in obj):
            found.extend(obj)
        elif obj:
            found.extend(t for _, t in flatten(obj)[0])
    return found
