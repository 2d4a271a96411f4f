"""The shared conformance suite: the same cases and oracles for every backend, torch first.

Run it as ``python -m torchlens.backends.conformance [--backend NAME]``; it prints a table
of cases by oracles (output, inventory, graph, replay) and exits non-zero when a backend fails
a check that torch passes.
"""

from torchlens.backends.conformance.cases import CASES, CASES_BY_NAME, ConformanceCase
from torchlens.backends.conformance.oracles import ORACLES, CaseRun, OracleResult
from torchlens.backends.conformance.runner import (
    ConformanceReport,
    Outcome,
    run_case,
    run_conformance,
)

__all__ = [
    "CASES",
    "CASES_BY_NAME",
    "CaseRun",
    "ConformanceCase",
    "ConformanceReport",
    "ORACLES",
    "OracleResult",
    "Outcome",
    "run_case",
    "run_conformance",
]
