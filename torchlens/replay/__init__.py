"""Replay validation: proof that a trace is what the model computed.

Arms: ``lint`` (graph integrity), ground truth (rerun the pristine model with the captured
RNG state and compare outputs), per-op replay (rerun each op from its saved parents) and
perturbation (changing a parent must change the op). See ``docs/validation.md``.

The second group of ``__all__`` is what the packages above replay (edits, debug,
distributed, the CLI) build on: they import it from here, never from replay's modules
(``tests/test_architecture.py``).
"""

from torchlens.replay.api import attach_status, before_trace, check_trace, replay, validate
from torchlens.replay.exemptions import (
    GROWS_TARGET,
    MUTATES_ARGUMENTS,
    PROVEN_BY_RULE,
    value_exempt,
)
from torchlens.replay.interpreter import LOCKSTEP, RESTORES, Interpreter, Unreplayable, calls
from torchlens.replay.lint import lint
from torchlens.replay.status import OpVerdict, ReplayFailure, ReplayStatus
from torchlens.replay.tolerances import TOLERANCES, comparable, tolerance

__all__ = [
    "validate", "replay", "check_trace", "lint", "ReplayStatus", "ReplayFailure", "OpVerdict",
    # for the packages above: validate=True's two halves (tl.trace, the CLI), the
    # interpreter that trace.rerun subclasses, the tolerances diff and find_nonfinite compare
    # with, and the exemption tables distributed extends
    "before_trace", "attach_status", "Interpreter", "Unreplayable", "calls", "LOCKSTEP",
    "RESTORES",
    "TOLERANCES", "tolerance", "comparable", "GROWS_TARGET", "MUTATES_ARGUMENTS",
    "PROVEN_BY_RULE", "value_exempt",
]  # fmt: skip
