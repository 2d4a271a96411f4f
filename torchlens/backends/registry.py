"""Backends by name: a dict of frozen :class:`BackendSpec` records and a few verbs over it.

The torch backend is registered at import and always listed first, because every other
backend is measured against it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torchlens.backends.protocol import BackendProtocol
from torchlens.errors import InvalidArgumentError, UnknownBackendError

__all__ = [
    "BackendSpec",
    "backend_specs",
    "get_backend_spec",
    "register_backend_spec",
    "unregister_backend_spec",
]

REFERENCE_BACKEND = "torch"


@dataclass(frozen=True)
class BackendSpec:
    """How to build one backend: its name, maturity and a factory for its protocol object."""

    name: str
    maturity: str  # "stable" | "preview" | "experimental"
    factory: Callable[[], BackendProtocol]  # builds a fresh protocol object
    description: str = ""

    def protocol(self) -> BackendProtocol:
        """Build the backend's protocol object.

        Example:
            >>> get_backend_spec("torch").protocol().name
            'torch'
        """
        return self.factory()


_SPECS: dict[str, BackendSpec] = {}


def register_backend_spec(spec: BackendSpec, *, replace: bool = False) -> BackendSpec:
    """Add ``spec`` to the registry and return it.

    Raises:
        InvalidArgumentError: a spec with that name exists and ``replace`` is false
            (code ``backend_exists``), or ``spec`` is not a :class:`BackendSpec`.
    """
    if not isinstance(spec, BackendSpec):
        raise InvalidArgumentError(
            f"register_backend_spec takes a BackendSpec, got {type(spec).__name__}",
            code="bad_backend_spec",
        )
    if spec.name in _SPECS and not replace:
        raise InvalidArgumentError(
            f"a backend named {spec.name!r} is already registered; pass replace=True to "
            "swap it, or pick another name",
            code="backend_exists",
        )
    _SPECS[spec.name] = spec
    return spec


def unregister_backend_spec(name: str) -> None:
    """Remove the spec called ``name`` (the torch reference backend cannot be removed).

    Raises:
        UnknownBackendError: no backend is called ``name``.
        InvalidArgumentError: ``name`` is ``"torch"`` (code ``reference_backend``).
    """
    if name == REFERENCE_BACKEND:
        raise InvalidArgumentError(
            "the torch backend is the reference every other backend is measured against "
            "and cannot be unregistered; register your backend under another name",
            code="reference_backend",
        )
    get_backend_spec(name)
    del _SPECS[name]


def get_backend_spec(name: str) -> BackendSpec:
    """The spec registered as ``name``.

    Raises:
        UnknownBackendError: with the known names in the message.

    Example:
        >>> get_backend_spec("torch").maturity
        'stable'
    """
    spec = _SPECS.get(name)
    if spec is None:
        known = ", ".join(repr(n) for n in _SPECS)
        raise UnknownBackendError(
            f"no backend named {name!r} is registered; known backends: {known}. Register "
            "one with torchlens.backends.registry.register_backend_spec",
        )
    return spec


def backend_specs() -> tuple[BackendSpec, ...]:
    """Every registered spec, torch first, then in registration order."""
    return tuple(sorted(_SPECS.values(), key=lambda s: s.name != REFERENCE_BACKEND))


def _torch_backend() -> BackendProtocol:
    from torchlens.backends.torch_backend import TorchBackend  # import on first use

    return TorchBackend()


register_backend_spec(
    BackendSpec(
        name=REFERENCE_BACKEND,
        maturity="stable",
        factory=_torch_backend,
        description="PyTorch eager capture: the reference backend",
    )
)
