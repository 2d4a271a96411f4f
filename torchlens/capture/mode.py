"""The function mode that sees every torch call of the forward and records it.

Inside ``__torch_function__`` torch has already popped this mode, so the call itself and
all the bookkeeping below run on plain torch: a ``F.linear`` is recorded once, as ``linear``,
not as the kernels it calls.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from torchlens.capture import rng
from torchlens.capture.autocast import any_autocast as _any_autocast
from torchlens.capture.autocast import autocast_state
from torchlens.capture.builder import TraceBuilder
from torchlens.capture.composite import opened_body
from torchlens.capture.controls import run_after_halt
from torchlens.capture.escapes import escape_call
from torchlens.capture.failures import note_model_error
from torchlens.capture.grad_calls import backward_call
from torchlens.capture.hooks import run_exit_hooks
from torchlens.capture.naming import FUNC_INFOS, func_info
from torchlens.capture.special import SETTLES, SPECIAL_OUTPUTS, written_arguments
from torchlens.capture.tree import fill, flatten, flatten_call
from torchlens.errors import CaptureError
from torchlens.trace import Op

__all__ = ["CaptureMode", "OpHook", "functorch_level"]

Tensor = torch.Tensor
# The torch.func transform level (None outside vmap, grad, jvp...). Inside a transform every
# tensor is a per-sample view of a batched one, without storage of its own: such calls are
# not recorded, and what the transform returns enters the record as the value it is.
functorch_level = torch._C._functorch.maybe_current_level

# Called after each recorded op with the op and its live output; may return a replacement
# tensor (interventions) or raise to halt the forward (stop_after).
OpHook = Callable[[Op, Tensor], "Tensor | None"]


class CaptureMode(TorchFunctionMode):
    """Records each tensor-producing call into a :class:`TraceBuilder`."""

    def __init__(self, builder: TraceBuilder, op_hooks: tuple[OpHook, ...] = ()) -> None:
        super().__init__()
        self.builder = builder
        self.op_hooks = op_hooks
        self._level = functorch_level()  # calls at a deeper level run unrecorded

    def __torch_function__(self, func, types, args=(), kwargs=None):
        try:
            info = FUNC_INFOS[func]
        except (KeyError, TypeError):
            info = func_info(func)
        if info.never_tensor or functorch_level() != self._level:
            if not info.never_tensor:  # (so a deeper level: inside torch.func.vmap, grad)
                self.builder.note_transform_call()
            elif func is _STORAGE and args:  # the storage may be resized out of sight (FSDP
                # frees what it gathered): saved values copied
                self.builder.payloads.protect(args[0])
            elif info.escape is not None and functorch_level() == self._level:
                return escape_call(self.builder, info.escape, func, args, kwargs)
            return func(*args, **kwargs) if kwargs else func(*args)
        if self.op_hooks and self.builder.halt_pending:  # stop_after= matched
            return run_after_halt(self.builder.halt_pending, func, args, kwargs)
        kwargs = kwargs or {}
        if info.opens and (info.opens is True or info.opens(args, kwargs)):
            return self._open(info.name, func, args, kwargs)
        if info.inplace and not args and kwargs:  # torch.nn.init passes tensor=...
            args, kwargs = _target_first(args, kwargs)
        elif info.backward:  # the .grad it writes are its outputs
            args, kwargs = backward_call(func, args, kwargs, self.builder)
        try:
            parent_args, args_template, kwargs_template = self.builder.arguments(
                _read_arguments(func, args), kwargs
            )
        except RuntimeError as err:  # a strided nested tensor has no sizes to record
            _refuse_nested(err, [t for _, t in flatten_call(args, kwargs)[0]])
        targets = inplace_targets(info.inplace, args, kwargs) if info.inplace or kwargs else ()
        for target in targets:
            self.builder.payloads.protect(target)
        rng_state = None
        if info.stochastic and rng.draws(info.name, args, kwargs):
            rng_state = rng.call_snapshot(args, kwargs)
        autocast = autocast_state() if _any_autocast() else None

        try:
            result = func(*args, **kwargs) if kwargs else func(*args)
        except Exception as err:  # the model's own error: noted, never wrapped
            note_model_error(err, self.builder, info.name)
            raise
        if info.settles:  # in flight when it returned (a collective): written, then recorded
            SETTLES[func](result)

        if isinstance(result, Tensor) and info.name not in SPECIAL_OUTPUTS:
            tensors = [result]
        else:
            special = SPECIAL_OUTPUTS.get(info.name)
            outputs = special(args, result) if special else flatten(result)[0]
            if not outputs:
                return result
            tensors = [t for _, t in outputs]
        # an op that returns an argument as it is (x.to(its own dtype), dropout in eval)
        # takes over its label; an edit that replaces that output must give it back
        before = self.builder.live_entries(tensors) if self.op_hooks and not targets else None
        try:
            ops = self.builder.record_call(
                info.name, func, args_template, kwargs_template, parent_args, tensors,
                inplace=bool(targets), rng_state=rng_state,
            )  # fmt: skip
        except RuntimeError as err:
            _refuse_nested(err, tensors)
        if autocast is not None:
            for op in ops:
                op.meta["autocast"] = autocast
        if args and result is args[0] and not targets and isinstance(result, Tensor):
            # its argument returned as it is (x.to(its own dtype), dropout in eval): the
            # argument's readers from here on read this label, whatever name they hold it by
            ops[0].meta["returns_argument"] = parent_args[0][0]
            if type(result) is torch.nn.Parameter:  # (an offloaded weight moved in)
                self.builder.note_returned_weight(ops[0], result)
        if self.op_hooks:
            result = self._run_hooks(ops, tensors, result, before)
        return result

    def _open(self, name: str, func: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """Run a composite function's body with this mode on, as a group of ops
        (``capture/composite.py``); torch popped the mode for the call, so push it back."""
        builder = self.builder
        builder.enter_group(name, [t for _, t in flatten_call(args, kwargs)[0]])
        outputs: list[Tensor] = []
        torch._C._push_on_torch_function_stack(self)
        try:
            result = opened_body(func)(*args, **kwargs)
            outputs = [t for _, t in flatten(result)[0]]
        finally:
            torch._C._pop_torch_function_stack()
            call = builder.exit_module(outputs)  # (or raised: none)
        if call is not None and builder.exit_hooks:
            return run_exit_hooks(builder, call, result, outputs)
        return result

    def _run_hooks(
        self, ops: list[Op], tensors: list[Tensor], result: Any, before: list | None
    ) -> Any:
        replaced = False
        for i, op in enumerate(ops):
            original = tensors[i]
            for hook in self.op_hooks:
                new = hook(op, tensors[i])
                if new is not None and new is not tensors[i]:
                    tensors[i] = new
                    replaced = True
            if before and before[i] is not None and tensors[i] is not original:
                self.builder.restore_entry(original, before[i])  # its readers read it
        if not replaced:
            return result
        if len(ops) == 1 and isinstance(result, Tensor):
            return tensors[0]
        _, template = flatten(result)
        return fill(template, tensors)


def _refuse_nested(err: RuntimeError, tensors: list[Tensor]) -> None:
    """Raise ``err`` again, or the typed refusal when a strided nested tensor caused it."""
    if any(t.is_nested and t.layout == torch.strided for t in tensors):
        raise CaptureError(  # (not a TypeError: a binary operator would swallow it)
            "a strided nested tensor (torch.nested with layout=torch.strided) has no shape "
            "to record; use layout=torch.jagged, or pad it (torch.nested.to_padded_tensor)",
            code="nested_tensor",
        ) from None
    raise err


def _read_arguments(func: Callable[..., Any], args: tuple) -> tuple:
    """The arguments a call reads: ``Tensor.__deepcopy__(memo)`` is recorded with an empty
    memo, since the memo (what ``copy.deepcopy`` copied so far, and the originals it keeps
    alive) holds tensors the copy never reads; replay copies with a fresh one."""
    if func is _DEEPCOPY and len(args) > 1:
        return (args[0], {})
    return args


_DEEPCOPY = Tensor.__deepcopy__
_STORAGE = Tensor.untyped_storage
_TARGET_KEYWORDS = ("tensor", "input")  # how an in-place call may name its target


def inplace_targets(inplace: bool | tuple, args: tuple, kwargs: dict) -> list[Tensor]:
    """The tensors a call writes into: ``out=``, ``inplace=True``, an in-place method, or
    the arguments at the positions ``inplace`` names (a FuncInfo's side writes)."""
    if type(inplace) is tuple:
        return [t for _, t in written_arguments(inplace, args)]
    out = kwargs.get("out")
    if out is not None:
        return [out] if isinstance(out, Tensor) else [t for t in out if isinstance(t, Tensor)]
    if inplace or kwargs.get("inplace") is True:
        if args and isinstance(args[0], Tensor):
            return [args[0]]
        for key in _TARGET_KEYWORDS:  # torch.nn.init.uniform_(tensor=w)
            if isinstance(kwargs.get(key), Tensor):
                return [kwargs[key]]
    return []


def _target_first(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """An in-place call whose target came by keyword (``torch.nn.init.uniform_(tensor=w)``,
    how ``handle_torch_function`` forwards it) as the same call with the target first, so
    it is protected, recorded and replayed like ``w.uniform_()``."""
    for key in _TARGET_KEYWORDS:
        if isinstance(kwargs.get(key), Tensor):
            rest = dict(kwargs)
            return (rest.pop(key),), rest
    return args, kwargs
