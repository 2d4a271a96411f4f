"""Backends: the one protocol a capture backend fills, the registry, and torch's adapter.

Torch is the reference backend; every other backend is measured against it by the
conformance suite (``python -m torchlens.backends.conformance``).

Example:
    >>> from torchlens.backends.registry import get_backend_spec
    >>> protocol = get_backend_spec("torch").protocol()
    >>> isinstance(protocol, BackendProtocol)
    True
    >>> protocol.capabilities["intermediate_derived_grads"].state
    'unsupported'
"""

from torchlens.backends.protocol import (
    CAPABILITY_NAMES,
    BackendProtocol,
    Capability,
    require_capability,
)
from torchlens.backends.registry import (
    BackendSpec,
    backend_specs,
    get_backend_spec,
    load_backend,
    register_backend_spec,
    unregister_backend_spec,
)
from torchlens.backends.torch_backend import TorchBackend
from torchlens.capabilities import TORCH_CAPABILITIES

__all__ = [
    "BackendProtocol",
    "BackendSpec",
    "CAPABILITY_NAMES",
    "Capability",
    "TORCH_CAPABILITIES",
    "TorchBackend",
    "backend_specs",
    "get_backend_spec",
    "load_backend",
    "register_backend_spec",
    "require_capability",
    "unregister_backend_spec",
]
