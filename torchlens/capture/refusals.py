"""Refuse callables whose operations capture cannot see: compiled, scripted, exported."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from torchlens.capture.roots import Root
from torchlens.capture.walk import named_modules
from torchlens.errors import UnsupportedModelError

__all__ = ["check_traceable", "check_root"]

_ADVICE = "trace the eager source module instead"
_OPTIMIZED = "torch._dynamo.eval_frame.OptimizedModule"  # torch.compile's module wrapper


def check_traceable(model: Any, modules: list[tuple[str, nn.Module]] | None = None) -> None:
    """Raise :class:`UnsupportedModelError` if ``model`` cannot be traced eagerly.

    ``modules`` is ``model``'s :func:`~torchlens.capture.walk.named_modules` when the caller
    has walked them already (a module model only).
    """
    if isinstance(model, type) and issubclass(model, nn.Module):
        raise UnsupportedModelError(
            f"got the class {model.__name__}, not a model: calling a class builds a new "
            f"module instead of running a forward; pass an instance, e.g. "
            f"tl.trace({model.__name__}(...), x)",
            code="module_class",
        )
    kind = type(model)
    names = {f"{c.__module__}.{c.__qualname__}" for c in kind.__mro__}
    if any(n.endswith("ExportedProgram") and n.startswith("torch.export") for n in names):
        raise UnsupportedModelError(
            "a torch.export ExportedProgram runs a captured graph, not eager Python, so "
            f"its operations cannot be recorded; {_ADVICE} (the module you exported)",
            code="exported_program",
        )
    owner = getattr(model, "__self__", None)  # schedule.step: the schedule's class
    if owner is not None:
        names |= {f"{c.__module__}.{c.__qualname__}" for c in type(owner).__mro__}
    if any(n.startswith("torch.distributed.pipelining.") for n in names):
        raise UnsupportedModelError(
            "pipeline parallel (torch.distributed.pipelining) runs the model's stages on "
            "different ranks and passes activations between them by send/recv over "
            "microbatches, which one process's trace cannot follow; trace each stage's "
            "module on its rank (stage.submod), or the unsplit model in one process",
            code="pipeline_parallel",
        )
    if (
        _OPTIMIZED in names
        or hasattr(model, "_torchdynamo_orig_callable")
        or getattr(model, "_compiled_call_impl", None) is not None  # model.compile()
    ):
        raise UnsupportedModelError(
            "this callable was wrapped by torch.compile, whose compiled graphs hide the "
            f"individual operations; {_ADVICE} (e.g. model._orig_mod)",
            code="compiled_module",
        )
    if isinstance(model, (torch.jit.ScriptModule, torch.jit.ScriptFunction)):
        raise UnsupportedModelError(
            "TorchScript modules and functions run in the TorchScript interpreter, where "
            f"torch function modes cannot see their operations; {_ADVICE}",
            code="torchscript_module",
        )
    if isinstance(model, nn.Module):
        _check_modules(named_modules(model) if modules is None else modules)
        return
    if not callable(model):
        raise UnsupportedModelError(
            f"expected an nn.Module or a function, got {kind.__name__}; pass the model "
            "(or a function of tensors) as the first argument",
            code="not_callable",
        )


def check_root(model: Any, root: Root) -> None:
    """:func:`check_traceable` for ``model`` and the modules of its ``root``
    (``capture/roots.py``): the owner of a traced method, the modules of ``root=``."""
    check_traceable(model, root.modules)  # (which checks them when model is a module)
    if root.itself is None:
        _check_modules(root.modules)


def _check_modules(modules: list[tuple[str, nn.Module]]) -> None:
    """Refuse TorchScript and torch.compile'd modules among ``modules`` (a walk)."""
    for address, sub in modules:
        kind = type(sub)  # (every trace walks every module: the class is asked once)
        if kind not in _EAGER_CLASSES:
            if issubclass(kind, torch.jit.ScriptModule):
                raise UnsupportedModelError(
                    f"submodule {address!r} is a TorchScript module whose operations "
                    f"cannot be recorded; {_ADVICE} (the eager version of {address!r})",
                    code="torchscript_module",
                )
            if f"{kind.__module__}.{kind.__qualname__}" != _OPTIMIZED:
                _EAGER_CLASSES.add(kind)
        if kind not in _EAGER_CLASSES or sub.__dict__.get("_compiled_call_impl") is not None:
            raise UnsupportedModelError(
                f"submodule {address!r} was compiled with torch.compile (or .compile()), "
                "whose graphs hide the individual operations, and Dynamo would trace "
                f"the capture's own code; {_ADVICE} (the eager version of {address!r}, "
                "e.g. its _orig_mod)",
                code="compiled_module",
            )


# module classes that are neither TorchScript nor torch.compile wrappers (a module of one
# may still be compiled in place: its _compiled_call_impl is asked every time)
_EAGER_CLASSES: set[type] = set()
