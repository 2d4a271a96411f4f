"""Replay validation: proof that a trace is what the model computed.

Arms: ``lint`` (graph integrity), ground truth (rerun the pristine model with the captured
RNG state and compare outputs), per-op replay (rerun each op from its saved parents) and
perturbation (changing a parent must change the op). See ``docs/validation.md``.

``tl.replay`` is the function :func:`replay`, and ``torchlens.replay`` is this package; an
import system that rebinds the package attribute (pytest's importlib mode does) would hide
the function, so the package is callable too and calling it calls :func:`replay`.
"""

import sys
import types

from torchlens.replay.api import check_trace, replay, validate
from torchlens.replay.lint import lint
from torchlens.replay.status import ReplayFailure, ReplayStatus

__all__ = ["validate", "replay", "check_trace", "lint", "ReplayStatus", "ReplayFailure"]


class _CallablePackage(types.ModuleType):
    """This package, callable as :func:`replay` (see the module docstring)."""

    def __call__(self, *args, **kwargs) -> ReplayStatus:
        return replay(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
