"""Backends by name: a dict of frozen :class:`BackendSpec` records and a few verbs over it.

The torch backend is registered at import and always listed first, because every other
backend is measured against it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torchlens.backends.protocol import BackendProtocol
from torchlens.backends.torch_backend import TorchBackend
from torchlens.errors import InvalidArgumentError, UnknownBackendError

__all__ = [
    "BackendSpec",
    "backend_specs",
    "get_backend_spec",
    "load_backend",
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
            "one with torchlens.backends.registry.register_backend_spec, or name it as "
            "package.module:object (see docs/backends.md)",
        )
    return spec


ENTRY_POINT_GROUP = "torchlens.backends"  # installed packages may register backends here


def load_backend(reference: str) -> BackendSpec:
    """The spec for ``reference``, registering a backend from the user's code when needed.

    Args:
        reference: a registered name (``"torch"``); an import path ``"package.module:obj"``
            where ``obj`` is a :class:`BackendSpec`, a backend class or a factory returning
            a protocol object; or the name of an entry point in the ``torchlens.backends``
            group of an installed package (its object, again, is any of those three).

    Returns:
        The registered :class:`BackendSpec` (registered under the protocol's ``name``).

    Raises:
        UnknownBackendError: nothing by that name, import path or entry point.
        InvalidArgumentError: ``backend_import_failed`` when the module cannot be imported
            or has no such object.

    Example:
        >>> load_backend("torch").name
        'torch'
        >>> load_backend("torchlens.backends.torch_backend:TorchBackend").name
        'torch'
    """
    if reference in _SPECS:
        return _SPECS[reference]
    if ":" in reference:
        return _register_object(_import_object(reference), reference)
    from importlib.metadata import entry_points

    for point in entry_points(group=ENTRY_POINT_GROUP):
        if point.name == reference:
            return _register_object(point.load(), reference)
    return get_backend_spec(reference)  # not registered: raises with the known names


def _import_object(reference: str) -> object:
    import importlib

    module_name, _, attribute = reference.partition(":")
    try:
        obj: object = importlib.import_module(module_name)
        for part in attribute.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as err:
        raise InvalidArgumentError(
            f"cannot load the backend {reference!r} ({type(err).__name__}: {err}); write it "
            "as package.module:object, with the module importable from here (on sys.path)",
            code="backend_import_failed",
        ) from None
    return obj


def _register_object(obj: object, reference: str) -> BackendSpec:
    if isinstance(obj, BackendSpec):
        spec = obj
    elif callable(obj):
        protocol = obj()
        spec = BackendSpec(protocol.name, protocol.maturity, obj, f"loaded from {reference}")
    else:
        raise InvalidArgumentError(
            f"{reference!r} is a {type(obj).__name__}; point at a BackendSpec, a backend "
            "class or a function that returns a backend",
            code="backend_import_failed",
        )
    known = _SPECS.get(spec.name)
    if known is not None and (known == spec or spec.name == REFERENCE_BACKEND):
        return known
    return register_backend_spec(spec)


def backend_specs() -> tuple[BackendSpec, ...]:
    """Every registered spec, torch first, then in registration order."""
    return tuple(sorted(_SPECS.values(), key=lambda s: s.name != REFERENCE_BACKEND))


register_backend_spec(
    BackendSpec(
        name=REFERENCE_BACKEND,
        maturity="stable",
        factory=TorchBackend,
        description="PyTorch eager capture: the reference backend",
    )
)
