"""The torch backend: an adapter over the public entries ``tl.trace`` and replay.

Registering it changed nothing about torch capture: ``capture`` is ``tl.trace`` (after the
capability table's refusals), ``validate`` is the replay oracle, and ``reference_output`` runs
the model on pristine torch even from inside a running capture. (The module is not called
``torch.py`` so that ``torch`` inside ``torchlens.backends`` always means PyTorch.)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torchlens.capabilities import TORCH_CAPABILITIES, Capability, refuse_unsupported
from torchlens.capture import normalize_call, suspended, trace
from torchlens.replay import ReplayStatus, check_trace
from torchlens.trace import Trace

__all__ = ["TorchBackend"]


class TorchBackend:
    """PyTorch eager capture, the reference and only stable backend.

    Example:
        >>> import torch
        >>> backend = TorchBackend()
        >>> print(backend.name, backend.maturity, backend.materialization)
        torch stable tensor
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
        >>> [op.func_name for op in backend.capture(model, torch.randn(2, 4), None)]
        ['linear', 'relu']
    """

    name: str = "torch"
    maturity: str = "stable"
    materialization: str = "tensor"  # loaded payloads materialize as torch.Tensor
    capabilities: Mapping[str, Capability] = TORCH_CAPABILITIES

    def reference_output(
        self, model: Any, args: Any, kwargs: Mapping[str, Any] | None = None
    ) -> Any:
        """``model(*args, **kwargs)`` with this thread's capture switched off.

        Called from inside a forward being traced, the run adds nothing to that trace and
        its module wrappers stay quiet. Nothing global is touched: RNG state advances exactly as
        a plain call would advance it.

        Args:
            model: the model or function.
            args: positional arguments, normalised like ``tl.trace`` does.
            kwargs: keyword arguments, or ``None``.

        Returns:
            Whatever the model returns.
        """
        args, kwargs = normalize_call(args, kwargs, model)
        with suspended():
            return model(*args, **kwargs)

    def capture(
        self, model: Any, args: Any, kwargs: Mapping[str, Any] | None = None, **options: Any
    ) -> Trace:
        """``tl.trace(model, args, kwargs, **options)``, after the capability table's refusals.

        Raises:
            CapabilityUnsupportedError: an option asks for an ``unsupported`` row, e.g.
                ``intermediate_derived_grads=True`` (code
                ``intermediate_derived_grads_unsupported``).
        """
        refuse_unsupported(options, self.capabilities, self.name)
        return trace(model, args, kwargs, **options)

    def validate(self, captured: Trace, reference: Any) -> ReplayStatus:
        """Replay ``captured`` and compare it with ``reference``.

        Returns:
            The :class:`~torchlens.replay.ReplayStatus` of ``torchlens.replay.check_trace``:
            lint, ground truth against ``reference``, per-op replay and perturbation.
        """
        return check_trace(captured, reference)

    def __repr__(self) -> str:
        return f"<TorchBackend name={self.name!r} maturity={self.maturity!r}>"
