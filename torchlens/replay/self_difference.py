"""Does the model differ from itself? One more plain forward, when the ground truth differs.

The ground-truth arm compares a plain forward with the captured one. When they differ, the
capture may be wrong, or the model may compute something else at each call by itself: a
Python step counter it advances, randomness drawn from outside torch's seed (reseeding
from the OS), the time. :func:`differs_from_itself` runs one more plain forward from the
same inputs, model state and RNG state as the first: if its outputs differ from that
first one's, the difference is the model's own, and the ground-truth arm is
``unverified`` with that reason (naming the first op whose value differs from the
capture's), never ``failed``.
"""

from __future__ import annotations

from typing import Any

import torch

from torchlens.capture import flatten, rng
from torchlens.replay.escape_values import PerturbingMode, Plan, recorded_groups, saved_fingerprint
from torchlens.replay.findings import Findings
from torchlens.replay.param_guard import ParamGuard
from torchlens.replay.tolerances import differs

__all__ = ["differs_from_itself", "note_self_difference", "SELF_DIFFERENCE"]

SELF_DIFFERENCE = (
    "the model's output differs between two plain calls from the same inputs, buffers and RNG state"
)


def differs_from_itself(
    model: Any, inputs: tuple[tuple, dict], start: Any, host: Any, reference: Any,
    trace: Any, atol: float | None, rtol: float | None, state: Any = None,
) -> str | None:  # fmt: skip
    """Run one more plain forward of ``model`` on ``inputs`` (a pristine copy, copied
    again here) from torch's RNG state ``start`` (Python's and NumPy's: ``host``, put back
    after) and compare its outputs with ``reference``, the first plain forward's. The
    caller rewinds the model's state before and after; a parameter the forward writes is
    copied first into ``state`` (a :class:`ModelState`), whose next rewind puts it back.

    Returns:
        None when the two plain forwards agree (a ground-truth difference is then the
        capture's), else the reason, naming the first op of ``trace`` whose value this
        forward computed otherwise.
    """
    from torchlens.replay.ground_truth import copy_inputs

    args, kwargs = copy_inputs(*inputs)
    mode = PerturbingMode(Plan(()), fingerprints=True, from_start=True)
    if state is not None:
        mode.guard = ParamGuard(state)
    try:
        with rng.restored(start), mode:
            output = model(*args, **kwargs)
    except Exception as err:  # noqa: BLE001 - a model that raises the second time differs
        return f"{SELF_DIFFERENCE}: the second call raised {type(err).__name__}"
    finally:
        rng.restore(host)
    got = [t.detach() for _, t in flatten(output)[0]]
    want = [t.detach() for _, t in flatten(reference)[0]]
    if len(got) == len(want) and not any(differs(a, b, atol, rtol) for a, b in zip(got, want)):
        return None
    label = _first_differing_op(trace, mode)
    if label is not None:
        where = f" (the first op whose value differs from the capture's: {label})"
    else:  # the second call computed what the capture did: the first call was the odd one
        moved = [
            name for name, a, b in zip(trace.output_labels, got, want) if differs(a, b, atol, rtol)
        ]  # fmt: skip
        where = (
            " (the first call differs from the later ones, which agree op by op: a first-call "
            "initialization or a flag set in Python on the first call; the first output that "
            f"differs: {moved[0]})"
            if len(got) == len(want) and moved
            else ""
        )
    return (
        f"{SELF_DIFFERENCE}{where}: state the model keeps in Python between calls (a step "
        "counter, a first-call initialization), randomness drawn from outside torch's seed, "
        "or the time; validation calls the model several times (see status.model_calls)"
    )


def _first_differing_op(trace: Any, mode: PerturbingMode) -> str | None:
    """The first op of ``trace`` whose saved value's fingerprint differs from the one the
    plain forward under ``mode`` computed (compared while both ran the same calls)."""
    for name, prints, ops in zip(mode.calls, mode.prints or (), recorded_groups(trace, True)):
        if name != ops[0].func_name:
            return ops[0].label  # (another call ran here: the paths parted)
        if prints is None or len(prints) != len(ops):
            continue
        for value, op in zip(prints, ops):
            saved = None if value is None else saved_fingerprint(op)
            if saved is None or saved[0].device != value[0].device:
                continue
            a, b = torch.stack(value).double(), torch.stack(saved).double()
            if ((a - b).abs() > (a[1].abs() + b[1].abs()) * 1e-6).any():
                return op.label
    return None


def note_self_difference(findings: Findings, reason: str) -> None:
    """Turn the ground-truth arm's failures into ``unverified`` with ``reason``: the
    model's own variation, not a capture error."""
    found = [f for f in findings.failures if f.arm == "ground_truth"]
    findings.failures = [f for f in findings.failures if f.arm != "ground_truth"]
    for failure in found:
        findings.unchecked(failure.label, "ground_truth", f"{reason} [{failure.reason}]")
    findings.differs_from_itself = True
