"""``tl.record``: run a model once and keep only the selected activations, cheaply."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from torch import nn

from torchlens._tensors import sharing
from torchlens.capture import session as _session
from torchlens.capture.api import normalize_call
from torchlens.capture.controls import Controls
from torchlens.capture.failures import trim_torchlens_frames
from torchlens.capture.record_mode import RecordMode
from torchlens.capture.refusals import check_root
from torchlens.capture.roots import Root, resolve_root
from torchlens.capture.tree import flatten
from torchlens.errors import ReentrantCaptureError
from torchlens.recording import Recording
from torchlens.selectors import Candidates

__all__ = ["record"]


def record(
    model: Any,
    args: Any = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    save: Any = None,
    intervene: Mapping[Any, Any] | None = None,
    stop_after: Any = None,
    root: Any = None,
) -> Recording:
    """Run ``model(*args, **kwargs)`` once, keeping only the values of ops ``save`` selects.

    No graph is built: each op is counted (so labels equal those of ``tl.trace``) and the
    rest of the work is done for matching ops only, which keeps the forward close to its
    plain speed (see ``benchmarks/bench_record.py``).

    Args:
        model: an ``nn.Module`` or a plain function of tensors, in eager mode.
        args: the positional arguments (one tensor, or a tuple/list of them).
        kwargs: keyword arguments for the call.
        save: a selector (``tl.func``, ``tl.module``, ``tl.label``, a callable taking an op
            view, or a combination); ``None`` keeps no values (``intervene=`` alone).
        intervene: ``{selector: fn}``; ``fn(tensor, op_view)`` returns the value downstream
            ops use instead (or a ``tl.Intervention``). Edited ops are kept too.
        stop_after: a selector; the forward halts right after the first matching op (when
            a rule selects ``tl.module(...).output``, once the module calls that return
            that op have returned, so that they count as returning it; ``tl.module("")``
            is the model's own call, whose output is what it returned).
        root: the modules a traced function calls, named for addresses, as in
            :func:`~torchlens.capture.api.trace`; or the
            :class:`~torchlens.capture.roots.Root` of ``model`` resolved once for many
            calls (``tl.extract`` walks a module's tree once per run, not per batch).

    Returns:
        A :class:`~torchlens.recording.Recording`; ``recording[label].out`` is a kept value,
        ``recording.output`` what the model returned (``None`` if halted).

    Raises:
        SelectorMatchError: ``no_match`` when a given selector matched no op.
        InterventionError: when an ``intervene=`` function returns a wrong value.
        ReentrantCaptureError: when called from inside a forward being captured.

    Example:
        >>> import torch, torchlens as tl
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
        >>> rec = tl.record(model, torch.randn(2, 4), save=tl.module("0"))
        >>> rec.labels
        ['linear_1']
    """
    walked = root if isinstance(root, Root) else resolve_root(model, root)
    check_root(model, walked)
    args, kwargs = normalize_call(args, kwargs, model)
    controls = Controls(save, intervene, stop_after)
    mode = RecordMode(controls)
    mode.add_inputs(args, kwargs)
    output = None
    try:
        with controls.halting(model, walked.modules):
            with recording_session(model, mode, root=walked):
                output = model(*args, **kwargs)
            if mode.exits is not None and not mode.halt_pending:  # tl.module("").output
                output = _root_returned(mode, walked, output)
    except Exception as err:  # the model's error then ends at the model's line
        trim_torchlens_frames(err)  # (module calls pass through capture/follow.py)
        raise
    if mode.halt_pending:  # halted on the forward's last op: the output is not returned
        output = None
    elif output is not None:  # the outputs are read as the trace reads them at its end
        mode.read([t for _, t in flatten(output)[0]])
    _protect_kept(mode, mode.modules, args, kwargs, output)
    meta = {"n_ops": mode.n_ops, **controls.meta()}
    controls.check(lambda: _candidates(mode))
    # module outputs are kept when the call returns, possibly out of execution order
    kept = sorted(mode.kept, key=lambda view: view.index)
    return Recording(kept, mode.store, output, meta)


def _root_returned(mode: RecordMode, root: Root, output: Any) -> Any:
    """The call of the whole model returned ``output``: ``tl.module("").output`` rules
    act on it as on any module call's (the model's own calls inside a traced method are
    ``<root>:1``..., the whole capture then ``<root>:0``, as ``tl.trace`` numbers them)."""
    called = any(mode._calls.get(id(module)) for address, module in root.modules if not address)
    new = mode.exits.on_exit(("", 0 if called else 1), root.type_name, output)
    return output if new is None else new


def _protect_kept(
    mode: RecordMode, modules: list[tuple[str, nn.Module]], args: tuple, kwargs: dict, output: Any
) -> None:
    """Copy kept values that alias tensors the caller keeps and may edit in place: the
    inputs, the output, and the model's parameters and buffers (``modules``: the next
    forward or optimizer step writes into those)."""
    payloads = mode.payloads
    if not mode.kept or not payloads.aliases:
        return  # nothing kept, or only copies
    for _, tensor in flatten((args, kwargs, output))[0]:
        payloads.protect(tensor)
    if not payloads.aliases:
        return
    weights = [t for _, m in modules for d in (m._parameters, m._buffers) for t in d.values()]
    for tensor in sharing(weights, payloads.aliases):
        payloads.protect(tensor)


@contextmanager
def recording_session(
    model: Any,
    mode: RecordMode,
    modules: list[tuple[str, nn.Module]] | None = None,
    root: Root | None = None,
) -> Iterator[None]:
    """Run a block with ``mode`` recording ``model`` (its walked ``modules``, or its
    ``root``, when known), Python's cyclic garbage collector paused as in ``tl.trace``
    (:func:`~torchlens._gc.collector_paused`)."""
    if _session.active_session() is not None:
        raise ReentrantCaptureError(
            "tl.record was called from inside a forward that is already being captured; "
            "capture the outer model once, or record after the outer capture ends",
        )
    with _session.collector_paused():
        with _session.running(_session.CaptureSession(mode, mode.tracker)):
            mode.install_hooks(model, modules, root)
            with mode:
                yield


def _candidates(mode: RecordMode) -> Candidates:
    modules = [address for address, _ in mode.modules]
    labels = [f"{name}_{i}" for name, n in mode.counts.items() for i in range(1, n + 1)]
    return Candidates(func_names=list(mode.counts), modules=modules, labels=labels)
