"""Backend-neutral oracles: each looks at one case's run and says passed or failed, and why.

They use only the protocol (``validate``) and the Trace data model, so any backend that fills
the protocol is judged by exactly the same checks as torch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

import torch

from torchlens.backends.conformance.cases import ConformanceCase
from torchlens.backends.protocol import BackendProtocol
from torchlens.capture import flatten
from torchlens.replay import lint
from torchlens.trace import Trace

__all__ = ["CaseRun", "ORACLES", "OracleResult", "OutcomeState"]

OutcomeState = Literal["passed", "failed", "not_comparable"]


@dataclass(frozen=True)
class CaseRun:
    """One case run through one backend: the reference output and the captured trace."""

    case: ConformanceCase
    reference: Any
    captured: Trace


@dataclass(frozen=True)
class OracleResult:
    """The verdict of one oracle on one run."""

    state: OutcomeState
    detail: str = ""


def _failed(detail: str) -> OracleResult:
    return OracleResult("failed", detail)


def output_close(protocol: BackendProtocol, run: CaseRun) -> OracleResult:
    """The captured output equals the reference output within ``assert_close`` tolerances."""
    captured = [t for _, t in flatten(run.captured.output)[0]]
    reference = [t for _, t in flatten(run.reference)[0]]
    if len(captured) != len(reference):
        return _failed(f"{len(captured)} output tensors, reference has {len(reference)}")
    for i, (got, want) in enumerate(zip(captured, reference)):
        try:
            torch.testing.assert_close(got.detach(), want.detach(), equal_nan=True)
        except AssertionError as err:
            first_line = str(err).strip().splitlines()[0]
            return _failed(f"output tensor {i}: {first_line}")
    return OracleResult("passed")


def op_inventory(protocol: BackendProtocol, run: CaseRun) -> OracleResult:
    """The multiset of recorded function names is the case's expected inventory."""
    got = Counter(op.func_name for op in run.captured)
    want = run.case.inventory()
    if got == want:
        return OracleResult("passed")
    missing, extra = want - got, got - want
    parts = []
    if missing:
        parts.append("missing " + ", ".join(f"{k} x{n}" for k, n in sorted(missing.items())))
    if extra:
        parts.append("unexpected " + ", ".join(f"{k} x{n}" for k, n in sorted(extra.items())))
    return _failed("; ".join(parts))


def graph_integrity(protocol: BackendProtocol, run: CaseRun) -> OracleResult:
    """The graph passes :func:`torchlens.replay.lint.lint` and its outputs are accounted for."""
    problems = lint(run.captured)
    n_outputs = len(flatten(run.captured.output)[0])
    if len(run.captured.output_labels) != n_outputs:
        problems.append(
            f"{len(run.captured.output_labels)} output labels for {n_outputs} output tensors"
        )
    if problems:
        more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
        return _failed("; ".join(problems[:3]) + more)
    return OracleResult("passed")


def replay_status(protocol: BackendProtocol, run: CaseRun) -> OracleResult:
    """``protocol.validate(captured, reference)`` returns a status whose state is ``passed``."""
    status = protocol.validate(run.captured, run.reference)
    state = getattr(status, "state", None)
    if state is None:
        return _failed(f"validate returned {type(status).__name__}, not a ReplayStatus")
    if state != "passed":
        first = (str(status).strip().splitlines() or [""])[0]
        return _failed(f"replay {state}: {first}")
    return OracleResult("passed")


Oracle = Callable[[BackendProtocol, CaseRun], OracleResult]

# Run in this order; the names are the report's columns.
ORACLES: Mapping[str, Oracle] = MappingProxyType(
    {
        "output": output_close,
        "inventory": op_inventory,
        "graph": graph_integrity,
        "replay": replay_status,
    }
)
