"""``tl.trace``: run a model once under a capture session and return the finished Trace."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from torchlens._version import __version__
from torchlens.capabilities import refuse_unsupported
from torchlens.capture import rng
from torchlens.capture.builder import TraceBuilder
from torchlens.capture.refusals import check_traceable
from torchlens.capture.session import CaptureSession
from torchlens.capture.tree import flatten
from torchlens.errors import InvalidArgumentError
from torchlens.trace import Trace

__all__ = ["trace", "normalize_call"]


def normalize_call(args: Any, kwargs: Mapping[str, Any] | None) -> tuple[tuple, dict]:
    """``args`` as a tuple of positional arguments and ``kwargs`` as a dict.

    A tuple or list is the positional arguments; anything else (a tensor, a dict) is the one
    positional argument. To pass a single list argument, wrap it: ``[[a, b]]``.
    """
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise InvalidArgumentError(
            f"kwargs must be a dict of keyword arguments, got {type(kwargs).__name__}",
            code="bad_kwargs",
        )
    if args is None:
        args = ()
    elif not isinstance(args, (tuple, list)) or hasattr(args, "_fields"):
        args = (args,)
    return tuple(args), dict(kwargs or {})


def trace(
    model: Any,
    args: Any = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    structure_only: bool = False,
    intermediate_derived_grads: bool = False,
) -> Trace:
    """Run ``model(*args, **kwargs)`` once and record every tensor operation.

    Args:
        model: an ``nn.Module`` or a plain function of tensors, in eager mode.
        args: the positional arguments: one object (a tensor) or a tuple/list of them.
            Nested lists, tuples and dicts of tensors are fine.
        kwargs: keyword arguments for the call.
        structure_only: record the graph and metadata only, keeping no values; reading
            ``op.out`` then raises :class:`~torchlens.errors.PayloadUnavailableError`.
        intermediate_derived_grads: refused for torch (see ``torchlens.capabilities``);
            torch records true gradients through ``save_grads=True`` instead.

    Returns:
        The :class:`~torchlens.trace.Trace`: ops in execution order with their edges, module
        calls and saved values. ``trace.output`` is what the model returned.

    Raises:
        UnsupportedModelError: for ``torch.compile``d, TorchScript or exported models.
        ReentrantCaptureError: when called from inside a forward that is being traced.
        IntermediateDerivedGradsUnsupportedError: for ``intermediate_derived_grads=True``.

    Example:
        >>> import torch, torchlens as tl
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
        >>> trace = tl.trace(model, torch.randn(2, 4))
        >>> trace["relu_1"].parents
        ('linear_1',)
    """
    refuse_unsupported({"intermediate_derived_grads": intermediate_derived_grads})
    check_traceable(model)
    args, kwargs = normalize_call(args, kwargs)
    builder = TraceBuilder(save_payloads=not structure_only)
    builder.register_model(model)
    arg_leaves, kwarg_leaves = flatten(args)[0], flatten(kwargs)[0]
    for path, tensor in arg_leaves:
        builder.add_input(_input_path(path, positional=True), tensor)
    for path, tensor in kwarg_leaves:
        builder.add_input(_input_path(path, positional=False), tensor)
    rng_state = rng.snapshot()
    with CaptureSession(model, builder):
        output = model(*args, **kwargs)
    out_tensors = [t for _, t in flatten(output)[0]]
    meta = {
        "structure_only": structure_only,
        "model_type": _type_name(model),
        "torch_version": torch.__version__,
        "torchlens_version": __version__,
        "training": bool(getattr(model, "training", False)),
    }
    return builder.finish(
        _type_name(model),
        output,
        out_tensors,
        rng_state=rng_state,
        meta=meta,
        keep_safe=[t for _, t in arg_leaves + kwarg_leaves] + out_tensors,
    )


def _input_path(path: str, positional: bool) -> str:
    head, _, rest = path.partition(".")
    text = f"args[{head}]" if positional else f"kwargs[{head!r}]"
    for part in rest.split(".") if rest else ():
        text += f"[{part}]" if part.isdigit() else f"[{part!r}]"
    return text


def _type_name(model: Any) -> str:
    if isinstance(model, torch.nn.Module):
        return type(model).__name__
    return getattr(model, "__qualname__", None) or type(model).__name__
