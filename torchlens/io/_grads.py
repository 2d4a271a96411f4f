"""Gradients on disk: ``grads.safetensors`` beside a trace, written once backward has run.

Backward runs after the forward's manifest is final (a streamed trace is complete before
any backward), so gradients live in their own file, which ``tl.load`` reads when present.
Complex gradients are stored as real views and named in the file's metadata.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from torchlens.capture import GradMapping, GradStore
from torchlens.errors import GradUnavailableError, TraceFileError
from torchlens.io import _layout
from torchlens.io._payloads import stored_form

__all__ = ["write_grads", "read_grads", "LoadedGrads"]


def write_grads(root: Path, grads: Mapping[str, torch.Tensor]) -> None:
    """Write the captured gradients of a trace saved at ``root``."""
    tensors = {label: stored_form(grad) for label, grad in sorted(grads.items())}
    complex_labels = ",".join(label for label, grad in sorted(grads.items()) if grad.is_complex())
    _layout.write_tensors(root / _layout.GRADS, tensors, metadata={"complex": complex_labels})


def read_grads(root: Path, labels: set[str]) -> GradStore | None:
    """The gradients saved beside the trace at ``root``, or None if backward never ran.

    Raises:
        TraceFileError: ``corrupt_payload`` for an unreadable file or unknown labels.
    """
    file = root / _layout.GRADS
    if not file.is_file():
        return None
    store = GradStore()
    try:
        with safe_open(str(file), framework="pt") as handle:
            complex_labels = set(
                filter(None, (handle.metadata() or {}).get("complex", "").split(","))
            )
            for label in handle.keys():
                value = handle.get_tensor(label)
                store.values[label] = (
                    torch.view_as_complex(value) if label in complex_labels else value
                )
    except (SafetensorError, OSError, RuntimeError, ValueError) as err:
        raise TraceFileError(
            f"{file} cannot be read ({err}); save the trace again after backward",
            code="corrupt_payload",
        ) from None
    unknown = set(store.values) - labels
    if unknown:
        raise TraceFileError(
            f"{file} holds gradients for labels the trace does not have: {sorted(unknown)[:5]}; "
            "save the trace again",
            code="corrupt_payload",
        )
    store.done = True
    return store


class LoadedGrads:
    """Stands in for a live gradient session on a loaded trace: the saved gradients can be
    read (``trace.grads``), but there is no autograd graph to run backward through."""

    def __init__(self, store: GradStore) -> None:
        self.grads = GradMapping(store)

    def backward(self, output, loss_fn=None, retain_graph: bool = False) -> None:
        raise GradUnavailableError(
            "a loaded trace has no live autograd graph, so backward cannot run again; its "
            "saved gradients are in trace.grads and op.grad. Trace the model again with "
            "save_grads=True to run a new backward",
            code="grads_not_captured",
        )
