"""Debugging workflows on top of a trace: where two runs diverge (:func:`diff`), where the
first NaN or Inf came from (:func:`find_nonfinite`), and a per-module summary with FLOPs
(:func:`summary`). See ``docs/debugging.md``.
"""

from torchlens.debug.diff import OpDiff, TraceDiff, diff
from torchlens.debug.nonfinite import NonFiniteReport, find_nonfinite
from torchlens.debug.summary import ModuleRow, ModuleSummary, summary, summary_by

__all__ = [
    "diff",
    "find_nonfinite",
    "summary",
    "TraceDiff",
    "OpDiff",
    "NonFiniteReport",
    "ModuleSummary",
    "ModuleRow",
    "summary_by",  # Trace.summary(by=...), which the data model delegates here
]
