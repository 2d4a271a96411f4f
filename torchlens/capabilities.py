"""The torch backend's "Can and cannot" table, as the one data constant the code honours.

It sits at the bottom of the package (it imports only :mod:`torchlens.errors`) so that
``tl.trace`` in ``capture/`` and the backend adapter in ``backends/`` refuse the same requests
from the same rows. :class:`Capability` is re-exported by :mod:`torchlens.backends`.

Example:
    >>> from torchlens.capabilities import TORCH_CAPABILITIES
    >>> TORCH_CAPABILITIES["backward_capture"].state
    'supported'
    >>> TORCH_CAPABILITIES["intermediate_derived_grads"].refusal_code
    'intermediate_derived_grads_unsupported'
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from torchlens.errors import CapabilityUnsupportedError, IntermediateDerivedGradsUnsupportedError

__all__ = [
    "CAPABILITY_NAMES",
    "Capability",
    "CapabilityState",
    "TORCH_CAPABILITIES",
    "refuse_unsupported",
]

CapabilityState = Literal["supported", "unsupported"]

# The spec's capability names, in the order of its table.
CAPABILITY_NAMES: tuple[str, ...] = (
    "backward_capture",
    "fastlog",
    "can_intervene",
    "rng_replay",
    "has_streaming",
    "structure_only_capture",
    "has_validation_replay",
    "payload_materialization",
    "intermediate_derived_grads",
)

# Refusal codes that have their own error class; any other code raises the base class.
_REFUSAL_ERRORS: dict[str, type[CapabilityUnsupportedError]] = {
    IntermediateDerivedGradsUnsupportedError.code: IntermediateDerivedGradsUnsupportedError,
}


@dataclass(frozen=True)
class Capability:
    """One row of a backend's "Can and cannot" table."""

    name: str  # one of CAPABILITY_NAMES
    state: CapabilityState
    notes: str  # the table's note, shown in refusals and docs
    refusal_code: str | None = None  # the error code an unsupported request raises
    option: str | None = None  # the capture keyword that requests it, e.g. "save_grads"
    instead: str = ""  # what to do instead, for unsupported rows

    @property
    def supported(self) -> bool:
        """Whether the backend does this."""
        return self.state == "supported"

    def require(self, backend: str = "torch") -> None:
        """Return if supported; otherwise raise the row's typed refusal.

        Raises:
            CapabilityUnsupportedError: (or its subclass for ``refusal_code``) when the row is
                ``unsupported``; ``err.code`` is the row's ``refusal_code``.
        """
        if self.supported:
            return
        code = self.refusal_code or CapabilityUnsupportedError.code
        error = _REFUSAL_ERRORS.get(code, CapabilityUnsupportedError)
        advice = f"; {self.instead}" if self.instead else ""
        raise error(
            f"the {backend} backend does not support {self.name}{advice}. "
            f"Its capability table says: {self.notes}",
            code=code,
        )


TORCH_CAPABILITIES: Mapping[str, Capability] = MappingProxyType(
    {
        row.name: row
        for row in (
            Capability(
                "backward_capture",
                "supported",
                "True backward capture through autograd hooks.",
                option="save_grads",
            ),
            Capability("fastlog", "supported", "Sparse recording."),
            Capability(
                "can_intervene",
                "supported",
                "Live `intervene=` and `stop_after=`.",
                option="intervene",
            ),
            Capability("rng_replay", "supported", "Replay restores the captured RNG state."),
            Capability("has_streaming", "supported", "Streaming save.", option="stream_to"),
            Capability(
                "structure_only_capture",
                "supported",
                "`structure_only=True`.",
                option="structure_only",
            ),
            Capability(
                "has_validation_replay",
                "supported",
                "Ground-truth rerun plus per-op replay and perturbation.",
            ),
            Capability(
                "payload_materialization",
                "supported",
                "Loaded payloads materialize as tensors.",
            ),
            Capability(
                "intermediate_derived_grads",
                "unsupported",
                "Refuses with `intermediate_derived_grads_unsupported`: torch records true "
                "gradients through `backward_capture`; the derived-gradient path is a "
                "preview-backend feature torch does not implement.",
                refusal_code="intermediate_derived_grads_unsupported",
                option="intermediate_derived_grads",
                instead=(
                    "use backward capture instead: tl.trace(model, x, save_grads=True), "
                    "then trace.backward() and read op.grad"
                ),
            ),
        )
    }
)


def refuse_unsupported(
    options: Mapping[str, Any],
    table: Mapping[str, Capability] = TORCH_CAPABILITIES,
    backend: str = "torch",
) -> None:
    """Raise the typed refusal of the first unsupported capability that ``options`` turn on.

    An option turns a capability on when its keyword (``Capability.option``) is present with
    a value other than ``None`` or ``False``.

    Raises:
        CapabilityUnsupportedError: with the row's ``refusal_code``.

    Example:
        >>> refuse_unsupported({"save_grads": True})  # supported: nothing happens
        >>> try:
        ...     refuse_unsupported({"intermediate_derived_grads": True})
        ... except CapabilityUnsupportedError as err:
        ...     print(err.code)
        intermediate_derived_grads_unsupported
    """
    for capability in table.values():
        if capability.option is None or capability.supported:
            continue
        value = options.get(capability.option)
        if value is not None and value is not False:
            capability.require(backend)
