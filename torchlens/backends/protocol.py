"""The one protocol every backend fills, with the capability record its table is made of.

A backend is anything with these seven members. The conformance suite and the registry only
speak this protocol, so a new backend never needs a special case elsewhere in the package.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Protocol, runtime_checkable

from torchlens.capabilities import CAPABILITY_NAMES, Capability, CapabilityState
from torchlens.errors import InvalidArgumentError
from torchlens.replay import ReplayStatus
from torchlens.trace import Trace

__all__ = [
    "BackendProtocol",
    "CAPABILITY_NAMES",
    "Capability",
    "CapabilityState",
    "Maturity",
    "require_capability",
]

Maturity = Literal["stable", "preview", "experimental"]


@runtime_checkable
class BackendProtocol(Protocol):
    """What a capture backend offers: identity, its capability table, and three verbs.

    Attributes:
        name: the registry name, e.g. ``"torch"``.
        maturity: ``"stable"``, ``"preview"`` or ``"experimental"``.
        materialization: what loaded payloads materialize as (torch: ``"tensor"``).
        capabilities: the "Can and cannot" table: capability name -> :class:`Capability`.
    """

    name: str
    maturity: str
    materialization: str
    capabilities: Mapping[str, Capability]

    def reference_output(self, model: Any, args: Any, kwargs: Mapping[str, Any] | None) -> Any:
        """Run ``model`` with no capture machinery active: the independent oracle arm."""
        ...

    def capture(
        self, model: Any, args: Any, kwargs: Mapping[str, Any] | None = None, **options: Any
    ) -> Trace:
        """Record one forward pass of ``model`` as a :class:`~torchlens.trace.Trace`."""
        ...

    def validate(self, captured: Trace, reference: Any) -> ReplayStatus:
        """Check ``captured`` by replay against ``reference``; a status, never a bare bool."""
        ...


def require_capability(backend: BackendProtocol, name: str) -> Capability:
    """The capability row ``name`` of ``backend``, refusing if the backend lacks it.

    This is the entry point of a capability that has no keyword of its own.

    Raises:
        InvalidArgumentError: ``name`` is not a capability (code ``unknown_capability``).
        CapabilityUnsupportedError: the row is ``unsupported``; ``.code`` is its refusal code.

    Example:
        >>> from torchlens.backends.registry import get_backend_spec
        >>> torch_backend = get_backend_spec("torch").protocol()
        >>> require_capability(torch_backend, "fastlog").state
        'supported'
    """
    row = backend.capabilities.get(name)
    if row is None:
        known = ", ".join(backend.capabilities)
        raise InvalidArgumentError(
            f"{name!r} is not a capability of the {backend.name} backend; known: {known}",
            code="unknown_capability",
        )
    row.require(backend.name)
    return row
