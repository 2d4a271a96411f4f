"""The public entries: ``tl.validate`` (a bool), ``tl.replay`` (the status) and the model-free
``check_trace`` that the backend protocol's ``validate(captured, reference)`` calls."""

from __future__ import annotations

import numbers
import time
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any

import torch

from torchlens.capture import (
    TRANSFORM_RESULT,
    UNSEEN_COMPUTATION,
    WITHOUT_GRAD,
    check_traceable,
    normalize_call,
    refuse_reentry,
    rng,
    suspended,
    trace_for_check,
)
from torchlens.errors import InvalidArgumentError
from torchlens.replay.backward import validate_backward
from torchlens.replay.completeness import check_completeness, look_first
from torchlens.replay.escape_values import Budget
from torchlens.replay.findings import Findings
from torchlens.replay.ground_truth import (
    ModelState,
    compare_outputs,
    copy_inputs,
    detached,
    expected_outputs,
    note_moved_parameters,
    rerun,
)
from torchlens.replay.interpreter import Checker
from torchlens.replay.lint import lint
from torchlens.replay.self_difference import differs_from_itself, note_self_difference
from torchlens.replay.status import ReplayStatus

__all__ = ["validate", "replay", "check_trace", "before_trace", "attach_status"]

SCOPES = ("forward", "backward")

# the trace tl.trace(..., validate=True) keeps, while attach_status validates it: replay
# compares its outputs with the ground-truth rerun too (see _compare_kept)
_KEPT: ContextVar[Any] = ContextVar("torchlens_kept_trace", default=None)
_KEPT_DIFFERS = (
    "the trace kept (tl.trace(..., validate=True)) differs from validation's plain forward "
    "started from the buffers and RNG state its capture started from: state the model keeps "
    "in Python moved on at the capture (a flag set by a first-call initialization, a step "
    "counter), so validation checked another forward than the one traced"
)


def validate(
    model: Any,
    args: Any = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    scope: str = "forward",
    atol: float | None = None,
    rtol: float | None = None,
    intervene: Mapping[Any, Any] | None = None,
    random_seed: int | None = None,
    accept_hidden_edges: bool = False,
) -> bool:
    """Capture ``model(*args, **kwargs)`` and prove by replay that the record is right.

    Same checks as :func:`replay`; True only when its status is ``passed`` (or, with
    ``accept_hidden_edges``, ``incomplete``).

    Args:
        model: an ``nn.Module`` or a function of tensors.
        args: positional arguments (one object, or a tuple/list of them).
        kwargs: keyword arguments.
        scope: ``"forward"``; ``"backward"`` validates backward capture where available.
        atol: absolute tolerance for floating values (default: per-dtype table).
        rtol: relative tolerance for floating values (default: per-dtype table).
        intervene: ``{selector: fn}`` edits, as for ``tl.trace``; the capture and the
            ground-truth rerun both apply them, so an edited forward can be proved too.
        random_seed: when given, ``torch.manual_seed(random_seed)`` runs first, as a user
            seeding before a forward would; the RNG is then left as that seeded forward
            leaves it. Without it the current RNG state is used (and put back the same way).
        accept_hidden_edges: also return True when the state is ``incomplete``: every
            recorded op and edge is proven and the only findings are dependencies that pass
            through Python values (``.item()``, ``.tolist()``), which the caller knows of.

    Returns:
        True only when every op was replayed and every edge proved (or exempt), and no
        hidden dependency was found unless ``accept_hidden_edges``.

    Raises:
        InvalidArgumentError: ``bad_scope`` for an unknown scope, ``bad_random_seed`` for a
            seed that is not an integer.

    Example:
        >>> import torch, torchlens as tl
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).eval()
        >>> validate(model, torch.randn(2, 4))
        True
    """
    status = replay(
        model, args, kwargs,
        scope=scope, atol=atol, rtol=rtol, intervene=intervene, random_seed=random_seed,
    )  # fmt: skip
    return status.accepted(accept_hidden_edges)


def replay(
    model: Any,
    args: Any = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    scope: str = "forward",
    atol: float | None = None,
    rtol: float | None = None,
    intervene: Mapping[Any, Any] | None = None,
    random_seed: int | None = None,
) -> ReplayStatus:
    """Capture one forward and run every validation arm; returns the :class:`ReplayStatus`.

    The model runs twice, a plain (ground-truth) forward and then the captured one, from
    the same buffers and RNG state. The rerun gets a deep copy of the inputs, so a cache,
    list or object the forward extends in place is seen by both as the caller passed it
    (and left as one plain forward leaves it); an input that cannot be copied makes a
    ground-truth difference unverified rather than failed. The model is left as one plain
    forward would leave it (buffers updated once), and so is the RNG: the checks draw
    nothing from it. A forward that modifies its parameters in place cannot be rewound, so
    it moves them twice and its ground-truth arm is unverified.

    Args and Raises: as :func:`validate`.

    Returns:
        The status: ``state``, per-op counts, and each failure with its op label and arm.

    Example:
        >>> import torch, torchlens as tl
        >>> status = replay(torch.nn.Linear(4, 3), torch.randn(2, 4))
        >>> status.state, status.replayed
        ('passed', 1)
    """
    if random_seed is not None:
        _seed(random_seed)
    if scope != "forward":
        return _other_scope(scope, model, args, kwargs, atol, rtol, intervene)
    args, kwargs = normalize_call(args, kwargs, model)
    check_traceable(model)  # refusals come before the model runs at all
    refuse_reentry()
    kept = _KEPT.get()
    # The ground-truth rerun goes first: on a heap not yet holding the trace's values it
    # costs what a plain forward costs. The capture then starts from the same state.
    state = ModelState(model)
    start = rng.snapshot()
    host = rng.host_snapshot()  # a forward may draw from Python's or NumPy's RNG too
    uncopied: list[str] = []
    pristine = copy_inputs(args, kwargs, uncopied)  # a forward may modify its inputs
    aliased: set[int] = set()  # tensors whose .data the forward took
    # watched: the rerun's escape calls (if any, the completeness arm will run) and its path
    began = time.perf_counter()
    output, watched = rerun(model, *pristine, start, intervene, aliased, True)
    budget = _budget(watched, time.perf_counter() - began)
    calls = 2  # the model calls made: the rerun and the capture, so far
    reference = detached(output)
    del output
    rng.restore(host)  # (torch's generators the rerun puts back itself)
    del pristine
    after_rerun = state.rewind()
    moved_parameters = state.changed_parameters()
    suspects = state.aliased(aliased)  # may have been written through .data: unseen
    if (moved_parameters or suspects) and not uncopied:
        # the forward wrote its own weights (RWKV rescales its layers at its first call in
        # eval mode): from the weights it left, rerun once more, keeping them to rewind to
        state = ModelState(model, keep_parameters=True, by_value=suspects)
        output, watched = rerun(model, *copy_inputs(args, kwargs), start, intervene, None, True)
        calls += 1
        reference = detached(output)
        del output
        rng.restore(host)
        after_rerun = state.rewind()
        moved_parameters = state.changed_parameters()
    spare = copy_inputs(args, kwargs)  # for the completeness arm, if the forward has escapes
    first = None
    if watched is not None and watched.vias and not uncopied and not moved_parameters:
        calls += 1
        try:
            # (with a reference, the forward the other way is run now too, where it is
            # cheaper, when the arm will want it: see look_first)
            seen = None if intervene is not None else reference
            first = look_first(
                model, spare, (start, host), state, watched, budget, seen, (atol, rtol)
            )
            calls += first.down is not None
        except Exception:  # noqa: BLE001 - validation returns: the arm runs it again later
            first = None
    began = time.perf_counter()
    trace = trace_for_check(model, args, kwargs, intervene=intervene)
    escapes = trace.escapes[-1].call + 1 if trace.escapes else 0
    budget.timed_capture(time.perf_counter() - began, escapes)
    after_capture = rng.snapshot()  # the checks touch torch's generators only
    trace.output = detached(trace.output)  # private to this check: its graph is not needed
    findings = Findings(trace)
    arms = _check_payloads(trace, findings, atol, rtol)
    findings.model_calls = calls
    if trace.structure_only:
        return findings.status(arms, unavailable=True)
    note_moved_parameters(
        findings, moved_parameters, "the capture could not start where the rerun did"
    )
    if kept is not None and not moved_parameters and not uncopied:
        _compare_kept(kept, reference, findings, atol, rtol)
    if not moved_parameters:
        outcome = Findings(trace) if uncopied else findings
        compare_outputs(trace, expected_outputs(trace), reference, outcome, atol, rtol)
        state.compare_buffers(after_rerun, outcome, atol, rtol)
        _blame_uncopied(outcome, findings, uncopied)
        if intervene is None and any(f.arm == "ground_truth" for f in findings.failures):
            calls += 1  # one more plain forward: does the model differ from itself?
            _check_self_difference(model, spare, start, host, state, reference, trace,
                                   findings, atol, rtol, after_rerun)  # fmt: skip
    rng.restore(after_capture)
    arms = ("lint", "ground_truth", *arms[1:])
    if trace.escapes:
        arms += ("completeness",)
        if moved_parameters:
            findings.unchecked(
                trace.escapes[0].label, "completeness",
                "the forward modified its parameters in place, so the escapes could not be "
                "perturbed from the state the capture started in",
            )  # fmt: skip
        else:
            try:
                _, _, forwards = check_completeness(
                    model, trace, spare, (start, host), state, findings, atol, rtol,
                    intervene, first, watched, budget,
                )  # fmt: skip
                calls += forwards
            except Exception as err:  # noqa: BLE001 - validation returns, whatever the arm met
                findings.unchecked(
                    trace.escapes[0].label, "completeness",
                    f"the completeness arm stopped on {type(err).__name__} ({err}); the escapes "
                    "were not all checked for hidden dependencies",
                )  # fmt: skip
            rng.restore(after_capture)
    del spare
    # weights written at every call go back to what one plain forward left (the trace,
    # whose saved values may alias them, is private to this check and done with)
    state.rewind_parameters()
    findings.model_calls = calls
    return findings.status(arms)


def before_trace(model: Any, args: Any, kwargs: Mapping[str, Any] | None) -> tuple:
    """What ``tl.trace(..., validate=True)`` keeps before its capture, so validation can
    start where the capture started: a copy of the inputs, the model's state, the RNGs."""
    args, kwargs = normalize_call(args, kwargs, model)
    return model, copy_inputs(args, kwargs), ModelState(model), rng.snapshot(), rng.host_snapshot()


def attach_status(
    trace: Any, before: tuple, intervene: Mapping[Any, Any] | None, run: Any = None
) -> Any:
    """Validate the forward ``trace`` recorded, from where its capture started
    (``before``, from :func:`before_trace`), and keep the proof on the trace:
    ``trace.status`` and, added to ``trace.hidden_edges``, the dependencies through
    Python values it found (labels are the same for the same call). The model is left
    as the capture left it (as one plain forward does), and so are the RNGs. ``run``
    (``run(model, args, kwargs)``; default :func:`replay`) makes the status, which is
    returned."""
    model, (args, kwargs), state, start, host = before
    left = ModelState(model)  # as the capture left it
    state.rewind()  # back to where the capture started
    rng.restore(start)
    rng.restore(host)
    token = _KEPT.set(trace)
    try:
        if run is None:
            status = replay(model, args, kwargs, intervene=intervene)
        else:
            status = run(model, args, kwargs)
    finally:
        _KEPT.reset(token)
        # (Python-side state validation cannot rewind: a flag the capture set with the
        # buffers it initialised, which the rewind above put back)
        left.rewind()
    trace.status = status
    found = getattr(status, "hidden_edges", ())
    trace.hidden_edges.extend(e for e in found if e not in trace.hidden_edges)
    return status


def check_trace(
    trace: Any, reference: Any = None, *, atol: float | None = None, rtol: float | None = None
) -> ReplayStatus:
    """Validate a finished trace without its model: lint, per-op replay, perturbation.

    With ``reference`` (the output of an independent pristine run of the same call), it is
    compared with the captured outputs as the ground-truth arm. The caller's RNG state is
    left as it was.

    Args:
        trace: the :class:`~torchlens.trace.Trace` to check.
        reference: what the model returned on a pristine run, or None to skip that arm.
        atol: absolute tolerance for floating values (default: per-dtype table).
        rtol: relative tolerance for floating values (default: per-dtype table).

    Returns:
        The :class:`ReplayStatus`; ``unavailable`` for a trace holding no values.

    Example:
        >>> import torch, torchlens as tl
        >>> model, x = torch.nn.Linear(4, 3), torch.randn(2, 4)
        >>> check_trace(tl.trace(model, x), reference=model(x)).state
        'passed'
    """
    findings = Findings(trace)
    arms = _check_payloads(trace, findings, atol, rtol)
    if trace.structure_only:
        return findings.status(arms, unavailable=True)
    if reference is not None:
        compare_outputs(trace, expected_outputs(trace), reference, findings, atol, rtol)
        arms = ("lint", "ground_truth", *arms[1:])
    return findings.status(arms)


def _check_payloads(trace: Any, findings: Findings, atol, rtol) -> tuple[str, ...]:
    """Lint, then (when the trace holds values) per-op replay and perturbation."""
    for message in lint(trace):
        label, _, reason = message.partition(": ")
        findings.fail(label, "lint", reason or message)
    for source in trace.sources:
        if source.path == UNSEEN_COMPUTATION:
            findings.unchecked(
                source.label, "lint",
                "a constant with autograd history that no recorded op made: it was computed "
                "out of the capture's sight (a TorchScript function, a C++ extension), or "
                "kept from an earlier call; the ops that made it may be missing",
            )  # fmt: skip
        elif source.path == TRANSFORM_RESULT:
            findings.decisions.append(
                f"{source.label} was first seen after calls inside a torch.func transform "
                "(vmap, grad), which the capture does not record: if the transform made it, "
                "what it was computed from has no edge to it (compute it outside the "
                "transform to have it recorded)"
            )
    without_grad = trace.meta.get(WITHOUT_GRAD)
    if without_grad:
        findings.decisions.append(
            f"{', '.join(without_grad)} first seen while grad was off (torch.no_grad, "
            "inference_mode): a value computed out of the capture's sight (a TorchScript "
            "function, a C++ extension) has no autograd history then, so it cannot be told "
            "from a constant the forward closes over, and what made it is not checked "
            "(validate with grad enabled to have such values linked to their parents)"
        )
    if trace.structure_only:
        return ("lint",)
    with suspended(), torch.no_grad():
        Checker(trace, findings, atol, rtol).run()
    return ("lint", "replay", "perturbation")


def _check_self_difference(
    model: Any, inputs: tuple, start: Any, host: Any, state: ModelState, reference: Any,
    trace: Any, findings: Findings, atol, rtol, after_rerun: dict,
) -> None:  # fmt: skip
    """When the ground truth differs, one more plain forward from where the first started
    tells the model's own variation (``unverified``) from a capture error (``failed``).

    A capture error leaves the model as the capture left it. A model that differs from
    itself is left as the first plain forward (the rerun) left it, its buffers holding
    ``after_rerun`` (see :meth:`ModelState.rewind`): the capture started from buffers
    rewound while Python-side state had moved on (a flag ``self.initialized = True`` set
    by a first-call initialisation of buffers), and what it left is what no plain call
    leaves."""
    left = ModelState(model)
    state.rewind()
    try:
        reason = differs_from_itself(
            model, inputs, start, host, reference, trace, atol, rtol, state
        )
    except Exception:  # noqa: BLE001 - validation returns: the difference stays a failure
        reason = None
    if reason is None:
        left.rewind()
        return
    state.leave(after_rerun)
    note_self_difference(findings, reason)


def _compare_kept(kept: Any, reference: Any, findings: Findings, atol, rtol) -> None:
    """The outputs of the trace ``kept`` must be what the ground-truth rerun returned, as
    the validated capture's are; where they differ, the ground-truth arm is unverified
    (the model differs from itself between the capture and validation), never failed."""
    outcome = Findings(kept)
    try:
        compare_outputs(kept, expected_outputs(kept), reference, outcome, atol, rtol)
    except Exception:  # noqa: BLE001 - a kept trace without its values: nothing to compare
        return
    for difference in outcome.failures:
        findings.unchecked(
            difference.label, "ground_truth", f"{_KEPT_DIFFERS} [{difference.reason}]"
        )


def _budget(watched: Any, seconds: float) -> Budget:
    """What each of the completeness arm's forwards may spend: a small multiple of the
    ground-truth rerun's calls and time (``watched``: its mode, when it counted them)."""
    ops = len(getattr(watched, "calls", ())) if watched is not None else 1 << 20
    return Budget.of(ops, len(getattr(watched, "vias", ())), seconds)


def _blame_uncopied(outcome: Findings, findings: Findings, uncopied: list[str]) -> None:
    """With an input the rerun could not get a copy of, a ground-truth difference may come
    from the forward modifying that input: each is noted unverified, with that reason."""
    for difference in outcome.failures if uncopied else ():
        findings.unchecked(difference.label, "ground_truth", f"{difference.reason}; {uncopied[0]}")


def _seed(random_seed: Any) -> None:
    if isinstance(random_seed, bool) or not isinstance(random_seed, numbers.Integral):
        raise InvalidArgumentError(
            f"random_seed must be an int (as for torch.manual_seed), got {random_seed!r}; "
            "pass an integer, or None to use the current RNG state",
            code="bad_random_seed",
        )
    torch.manual_seed(random_seed)


def _other_scope(scope: str, model, args, kwargs, atol, rtol, intervene) -> ReplayStatus:
    if scope not in SCOPES:
        raise InvalidArgumentError(
            f"scope must be one of {SCOPES}, got {scope!r}; use scope='forward' to validate "
            "the recorded forward pass",
            code="bad_scope",
        )
    if intervene is not None:
        raise InvalidArgumentError(
            "intervene= is validated with scope='forward'; backward validation checks the "
            "gradients of the unedited model",
            code="bad_scope",
        )
    return validate_backward(model, args, kwargs, atol=atol, rtol=rtol)
