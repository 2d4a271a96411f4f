"""Collects what each arm found, op by op, and turns it into a :class:`ReplayStatus`."""

from __future__ import annotations

from operator import itemgetter
from typing import Any

from torchlens.replay.status import ReplayFailure, ReplayStatus

__all__ = ["Findings"]

_first = itemgetter(0)
_VERIFIED = {"verified"}


class Findings:
    """Per-op outcomes of the arms; :meth:`status` summarizes them honestly."""

    def __init__(self, trace: Any) -> None:
        self.op_labels = [op.label for op in trace.ops]
        self.failures: list[ReplayFailure] = []
        self.gaps: list[ReplayFailure] = []
        self._replayed: set[str] = set()
        self._verified: set[str] = set()
        self._exempt: set[str] = set()
        self.exempt_edges = 0  # edges a table exempts without a call
        self.unread: list[ReplayFailure] = []  # edges no probe could show, exempt by a rule
        self.hidden_edges: list[Any] = []  # dependencies through escapes (completeness arm)
        self.decisions: list[str] = []  # escapes that decide which ops run (completeness arm)

    def fail(self, label: str, arm: str, reason: str) -> None:
        self.failures.append(ReplayFailure(label, arm, reason))

    def unchecked(self, label: str, arm: str, reason: str) -> None:
        self.gaps.append(ReplayFailure(label, arm, reason))

    def replayed(self, label: str) -> None:
        self._replayed.add(label)

    def perturbed(self, label: str, verdicts: list[tuple[str, str]]) -> None:
        """Record the per-parent verdicts of one op: ``verified``, ``exempt`` (a table, no
        call needed), ``unread`` (no probe showed it; a rule says why), ``failed`` or
        ``unchecked``."""
        kinds = set(map(_first, verdicts))
        if kinds == _VERIFIED:  # every edge proved: the usual op
            self._verified.add(label)
            return
        for verdict, reason in verdicts:
            if verdict == "failed":
                self.fail(label, "perturbation", reason)
            elif verdict == "unchecked":
                self.unchecked(label, "perturbation", reason)
            elif verdict == "exempt":
                self.exempt_edges += 1
            elif verdict == "unread":
                self.unread.append(ReplayFailure(label, "perturbation", reason))
        if kinds & {"failed", "unchecked"}:
            return
        (self._verified if "verified" in kinds else self._exempt).add(label)

    def status(self, arms: tuple[str, ...], unavailable: bool = False) -> ReplayStatus:
        """The summary: ``failed`` > ``unavailable`` > ``unverified`` > ``passed``."""
        gap_labels = {gap.label for gap in self.gaps}
        if self.failures:
            state = "failed"
        elif unavailable:
            state = "unavailable"
        elif self.gaps:
            state = "unverified"
        else:
            state = "passed"
        return ReplayStatus(
            state=state,
            ops=len(self.op_labels),
            replayed=len(self._replayed),
            perturbation_verified=len(self._verified),
            exempt=len(self._exempt),
            unverified=len(gap_labels),
            exempt_edges=self.exempt_edges,
            unread=list(self.unread),
            failures=list(self.failures),
            unchecked=list(self.gaps),
            arms=arms,
            hidden_edges=list(self.hidden_edges),
            decisions=list(self.decisions),
        )
