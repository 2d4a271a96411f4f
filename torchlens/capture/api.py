"""``tl.trace``: run a model once under a capture session and return the finished Trace."""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping
from typing import Any

import torch

from torchlens._version import __version__
from torchlens.capabilities import refuse_unsupported
from torchlens.capture import rng
from torchlens.capture.builder import TraceBuilder
from torchlens.capture.controls import Controls, trace_candidates
from torchlens.capture.escapes import EscapeHook
from torchlens.capture.failures import attach_partial_trace, trim_torchlens_frames
from torchlens.capture.grads import GradCapture
from torchlens.capture.hooks import run_exit_hooks
from torchlens.capture.refusals import check_root
from torchlens.capture.roots import Root, resolve_root
from torchlens.capture.session import capture_session, collector_paused
from torchlens.capture.sinks import open_stream_sink
from torchlens.capture.source import make_source_hook
from torchlens.capture.special import RELEASES
from torchlens.capture.tree import flatten
from torchlens.errors import InvalidArgumentError
from torchlens.trace import Trace

__all__ = ["trace", "trace_for_check", "normalize_call"]


def normalize_call(
    args: Any, kwargs: Mapping[str, Any] | None, model: Any = None
) -> tuple[tuple, dict]:
    """``args`` as a tuple of positional arguments and ``kwargs`` as a dict.

    A tuple or list is the positional arguments; anything else (a tensor, a dict, a
    namedtuple) is the one positional argument. One exception, which needs ``model``: when
    the callable (``model.forward`` for a module) takes exactly one positional parameter
    and no ``*args``, a tuple or list of several items is that one argument, since it could
    not be spread. To pass a single list argument in every case, wrap it: ``[[a, b]]``.

    Args:
        args: one object, or a tuple/list of positional arguments; None is no arguments.
        kwargs: keyword arguments, or None.
        model: the callable the arguments are for, to apply the one-parameter rule.

    Returns:
        ``(args, kwargs)`` ready for ``model(*args, **kwargs)``.

    Raises:
        InvalidArgumentError: ``bad_kwargs`` when ``kwargs`` is not a mapping.

    Example:
        >>> import torch
        >>> pair = (torch.ones(1), torch.zeros(1))
        >>> len(normalize_call(pair, None)[0])
        2
        >>> len(normalize_call(pair, None, lambda xs: xs[0] + xs[1])[0])
        1
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
    elif len(args) > 1 and model is not None and _takes_one_argument(model):
        args = (args,)
    return tuple(args), dict(kwargs or {})


def _takes_one_argument(model: Any) -> bool:
    """Whether ``model`` (its ``forward`` for a module) has exactly one positional
    parameter and no ``*args``; False when its signature cannot be read."""
    target = model.forward if isinstance(model, torch.nn.Module) else model
    try:
        parameters = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):  # builtins and C callables without a signature
        return False
    kinds = [p.kind for p in parameters]
    if inspect.Parameter.VAR_POSITIONAL in kinds:
        return False
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(kind in positional for kind in kinds) == 1


def trace(
    model: Any,
    args: Any = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    structure_only: bool = False,
    save: Any = None,
    intervene: Mapping[Any, Any] | None = None,
    stop_after: Any = None,
    stream_to: str | os.PathLike | None = None,
    save_grads: bool = False,
    intermediate_derived_grads: bool = False,
    source: bool = False,
    root: Any = None,
    validate: bool = False,
) -> Trace:
    """Run ``model(*args, **kwargs)`` once and record every tensor operation.

    Every module called during the forward is recorded, whatever ``model`` is, at an
    address relative to the capture's root (see ``docs/generation.md``): the module itself;
    the owner of a bound method (``tl.trace(lm.generate, kwargs=...)``: each call of ``lm``
    is a call of ``""``, one per decoding step, and the whole capture is call 0); or the
    modules given as ``root=``. Any other module gets its class name as its address.

    Args:
        model: an ``nn.Module``, a bound method of one, or any function of tensors (a
            ``functools.partial``, a sampling loop...), in eager mode.
        args: the positional arguments: one object (a tensor) or a tuple/list of them
            (passed whole when ``forward`` takes one positional parameter; see
            :func:`normalize_call`). Nested lists, tuples and dicts of tensors are fine.
        kwargs: keyword arguments for the call.
        structure_only: record the graph and metadata only, keeping no values; reading
            ``op.out`` then raises :class:`~torchlens.errors.PayloadUnavailableError`.
        save: a selector (``tl.func("relu")``, ``tl.module("layers.*")``, ...): the whole
            graph is recorded but only matching ops keep a value (see ``docs/selectors.md``).
        intervene: ``{selector: fn}``; ``fn(tensor, op)`` returns the value downstream ops
            use instead of each matching op's output (or a ``tl.Intervention``).
        stop_after: a selector; the forward halts right after the first matching op (once
            the module calls that return that op have returned, so that they count as
            returning it, as in ``tl.record``) and the partial trace comes back with
            ``trace.halted`` True and no output.
        stream_to: a directory to write each value to as it is produced, keeping none in
            memory; the returned trace reads them back lazily (see ``docs/saving.md``).
        save_grads: keep the live autograd graph and hook it, so that after
            ``trace.backward()`` (or ``loss.backward()`` on ``trace.output``) every op has
            ``op.grad`` and ``trace.grads["0.weight"]`` holds parameter gradients. With
            ``save=``, only the ops it selects (``tl.module(...).output`` included) keep
            a gradient; sources always do.
        intermediate_derived_grads: refused for torch (see ``torchlens.capabilities``);
            torch records true gradients through ``save_grads=True`` instead.
        source: note the model's line behind each op, read as ``op.source`` (file, line,
            function); it walks the Python stack per op, so it is off by default.
        root: for a function, the modules it calls, named: one module (addresses relative
            to it, its own calls at ``""``) or a dict ``{"unet": unet, "vae": vae}``
            (addresses ``unet.down_blocks.0``...). Their weights are parameter sources
            with those addresses even when read outside a call of theirs.
        validate: also validate the forward (``tl.replay``, from the state this capture
            started in) and keep the proof on the trace: ``trace.status`` and the hidden
            edges it found in ``trace.hidden_edges``, which ``draw``, ``show`` and
            ``save`` carry. The model is called several times (see
            ``docs/validation.md``) and left as one plain forward leaves it.

    Returns:
        The :class:`~torchlens.trace.Trace`: ops in execution order with their edges, module
        calls and saved values. ``trace.output`` is what the model returned.

    Raises:
        Exception: the model's own error, unchanged in type; it carries
            ``err.partial_trace``, the trace of the ops recorded before the failing call
            (named by ``partial_trace.meta["failed_call"]``; see ``docs/debugging.md``).
        UnsupportedModelError: for ``torch.compile``d, TorchScript or exported models.
        ReentrantCaptureError: when called from inside a forward that is being traced.
        IntermediateDerivedGradsUnsupportedError: for ``intermediate_derived_grads=True``.
        InvalidArgumentError: ``save_grads_no_grad`` for ``save_grads=True`` under
            ``torch.no_grad()`` (or with gradients otherwise switched off); ``bad_root``
            for a ``root=`` that is not a module or a dict of named modules.
        SelectorMatchError: ``no_match`` when a ``save=``, ``intervene=`` or ``stop_after=``
            selector matched no op.
        InterventionError: when an ``intervene=`` function returns a wrong value.

    Example:
        >>> import torch, torchlens as tl
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
        >>> trace = tl.trace(model, torch.randn(2, 4))
        >>> trace["relu_1"].parents
        ('linear_1',)
    """
    before = None
    if validate:  # (validation sits a layer above capture: imported when asked for)
        from torchlens.replay import before_trace

        before = before_trace(model, args, kwargs)
    try:
        captured = _capture(
            model, args, kwargs,
            structure_only=structure_only, save=save, intervene=intervene,
            stop_after=stop_after, stream_to=stream_to, save_grads=save_grads,
            intermediate_derived_grads=intermediate_derived_grads, source=source,
            root=root, keep_caller_safe=True,
        )  # fmt: skip
    except Exception as err:  # a model's error then goes from this call to the model's line
        trim_torchlens_frames(err)
        raise
    if before is not None:
        from torchlens.replay import attach_status

        attach_status(captured, before, intervene)
    return captured


def trace_for_check(
    model: Any,
    args: Any = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    intervene: Mapping[Any, Any] | None = None,
    escape_hook: EscapeHook | None = None,
) -> Trace:
    """:func:`trace` for a check that alone holds the trace and the output (``tl.validate``).

    :func:`trace` copies each saved value that is the caller's input or the returned
    output, so the caller may edit those afterwards: a copy of the output at least, which
    costs as much as a small layer. No caller code runs between such a capture and the
    check reading it, so here they stay aliases (the model's buffers are still copied).
    ``escape_hook(call, value)``, when given, returns the value each escape gives the
    model instead (validation's completeness arm perturbs them).

    Example:
        >>> import torch
        >>> model, x = torch.nn.Linear(4, 3), torch.randn(2, 4)
        >>> checked = trace_for_check(model, x)
        >>> checked["linear_1"].out.data_ptr() == checked.output.data_ptr()
        True
    """
    return _capture(
        model, args, kwargs, intervene=intervene, keep_caller_safe=False, escape_hook=escape_hook
    )


def _capture(
    model: Any,
    args: Any,
    kwargs: Mapping[str, Any] | None,
    *,
    structure_only: bool = False,
    save: Any = None,
    intervene: Mapping[Any, Any] | None = None,
    stop_after: Any = None,
    stream_to: str | os.PathLike | None = None,
    save_grads: bool = False,
    intermediate_derived_grads: bool = False,
    source: bool = False,
    root: Any = None,
    keep_caller_safe: bool,
    escape_hook: EscapeHook | None = None,
) -> Trace:
    """The capture behind :func:`trace`; ``keep_caller_safe``: copy saved values that are
    the caller's inputs or the returned outputs (see :func:`trace_for_check`); an
    ``escape_hook`` replaces the values escapes give (``capture/escapes.py``)."""
    refuse_unsupported({"intermediate_derived_grads": intermediate_derived_grads})
    if save_grads and not torch.is_grad_enabled():
        raise InvalidArgumentError(
            "save_grads=True records gradients, but this call runs under torch.no_grad() "
            "(or inference_mode, or set_grad_enabled(False)), so the forward builds no "
            "autograd graph; call tl.trace outside that block, or drop save_grads",
            code="save_grads_no_grad",
        )
    walked = resolve_root(model, root)
    check_root(model, walked)
    args, kwargs = normalize_call(args, kwargs, model)
    with collector_paused():  # the whole capture, up to the frozen trace (see there)
        sink = open_stream_sink(stream_to) if stream_to is not None else None
        controls = Controls(save, intervene, stop_after, structure_only=structure_only)
        builder = TraceBuilder(
            save_payloads=not structure_only, sink=sink, payload_filter=controls.save_filter()
        )
        builder.add_modules(walked.modules)
        if escape_hook is not None:  # validation's completeness arm perturbs escaped values
            builder.escape_hook = escape_hook
        grads = GradCapture(builder.payload_filter) if save_grads else None
        if grads is not None:
            builder.observers.append(grads.observe)
            if controls.save is not None and controls.save.at_exit:  # .output selectors
                grads.pending = {}
                builder.late_selected.append(grads.select)
            if sink is not None:
                grads.sinks.append(sink.write_grads)
        arg_leaves, kwarg_leaves = flatten(args)[0], flatten(kwargs)[0]
        for positional, leaves in ((True, arg_leaves), (False, kwarg_leaves)):
            for path, tensor in leaves:
                builder.add_input(_input_path(path, positional), tensor)
        rng_state = rng.snapshot()
        output = None
        hooks = ((make_source_hook(),) if source else ()) + controls.hooks(builder)
        try:
            with controls.halting(model, walked.modules):
                with capture_session(builder, hooks, walked):
                    output = model(*args, **kwargs)
                if builder.exit_hooks and builder.halt_pending is None:  # the root's call
                    out = [t for _, t in flatten(output)[0]]  # ends: tl.module("").output
                    root = builder.root_call(walked.type_name, out)
                    output = run_exit_hooks(builder, root, output, out)
            if builder.halt_pending is not None:  # halted on the forward's last op
                output = None  # (the forward returned it; a halted trace has no output)
        except Exception as err:  # the model's own error: it carries what ran before it
            attach_partial_trace(
                err, builder, walked.type_name, rng_state, _meta(walked, controls, structure_only)
            )
            raise
        out_tensors = [t for _, t in flatten(output)[0]]
        keep = [t for _, t in arg_leaves + kwarg_leaves] + out_tensors if keep_caller_safe else []
        result = builder.finish(
            walked.type_name,
            output,
            out_tensors,
            rng_state,
            _meta(walked, controls, structure_only),
            keep + builder.sources.model_buffers,
        )
        if grads is not None:
            grads.attach(result)
        else:  # no live graph kept: let go of what the run hung on the values (special.py)
            for release in RELEASES:
                release(result)
        if sink is not None:
            sink.close(result)
        controls.check(lambda: trace_candidates(result))
        return result


def _meta(root: Root, controls: Controls, structure_only: bool) -> dict[str, Any]:
    meta = {
        "structure_only": structure_only,
        "model_type": root.type_name,
        "torch_version": torch.__version__,
        "torchlens_version": __version__,
        "training": bool(root.modules and root.modules[0][1].training),
        **controls.meta(),
    }
    if root.fallbacks:  # modules named by class: print(trace) says how to name them
        meta["fallback_modules"] = list(root.fallbacks)
    return meta


def _input_path(path: str, positional: bool) -> str:
    head, _, rest = path.partition(".")
    text = f"args[{head}]" if positional else f"kwargs[{head!r}]"
    for part in rest.split(".") if rest else ():
        text += f"[{part}]" if part.isdigit() else f"[{part!r}]"
    return text
