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
from torchlens.capture.tree import flatten

__all__ = ["install_module_hooks"]


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


def _exit(builder: TraceBuilder, thread: int, module, args, kwargs, output) -> None:
    if threading.get_ident() != thread or builder.paused:
        return
    with torch._C.DisableTorchFunction():
        builder.exit_module(_tensors_in(output))


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
