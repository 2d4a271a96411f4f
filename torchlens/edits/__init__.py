"""Edit helpers: small factories returning the ``fn(tensor, op)`` that ``intervene=`` takes.

Each helper documents the math it does on the op's output ``t``. Heads are picked along one
axis (``heads=[0, 3]``, ``head_dim=1`` for the ``(batch, heads, tokens, head_dim)`` layout
of attention's q, k, v and ``scaled_dot_product_attention``'s output); the other heads keep
their values. Wrong shapes or axes raise :class:`~torchlens.errors.InterventionError` naming
the op and the shapes.

:func:`edit_pattern` recomputes a ``scaled_dot_product_attention`` op's output from an
edited attention pattern; :func:`patch_pattern` patches another run's pattern in (and
``sweep(..., patch="pattern")`` sweeps it). :func:`rerun` (also ``trace.rerun(edits)``)
applies edits to a finished trace, recomputing only their downstream cone; :func:`patch`
builds the edits of activation patching (of some positions or heads only, if asked),
:func:`sweep` runs it over sites x positions x heads and :func:`attribution` estimates the
same cells from one backward. Both return a :class:`LabelledTensor`. :func:`logit_lens`
decodes each layer's residual stream.

Example:
    >>> import torch, torchlens as tl
    >>> from torchlens import edits
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
    >>> trace = tl.trace(model, torch.randn(2, 4), intervene={tl.func("relu"): edits.zero()})
    >>> float(trace.output.abs().sum())
    0.0
"""

from torchlens.edits._attention import edit_pattern, patch_pattern
from torchlens.edits._helpers import (
    add,
    clamp,
    mean,
    project,
    replace,
    resample,
    scale,
    zero,
)
from torchlens.edits.labelled import LabelledTensor
from torchlens.edits.lens import LogitLens, logit_lens
from torchlens.edits.rerun import check_comparable, patch, rerun
from torchlens.edits.sweep import attribution, logit_diff, sweep

__all__ = [
    "LabelledTensor",
    "LogitLens",
    "add",
    "attribution",
    "check_comparable",
    "clamp",
    "edit_pattern",
    "logit_diff",
    "logit_lens",
    "mean",
    "patch",
    "patch_pattern",
    "project",
    "replace",
    "rerun",
    "resample",
    "scale",
    "sweep",
    "zero",
]
