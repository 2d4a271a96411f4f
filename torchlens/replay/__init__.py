"""Replay validation: proof that a trace is what the model computed.

Arms: ``lint`` (graph integrity), ground truth (rerun the pristine model with the captured
RNG state and compare outputs), per-op replay (rerun each op from its saved parents) and
perturbation (changing a parent must change the op). See ``docs/validation.md``.
"""

from torchlens.replay.api import check_trace, replay, validate
from torchlens.replay.lint import lint
from torchlens.replay.status import OpVerdict, ReplayFailure, ReplayStatus

__all__ = [
    "validate", "replay", "check_trace", "lint", "ReplayStatus", "ReplayFailure", "OpVerdict",
]  # fmt: skip
