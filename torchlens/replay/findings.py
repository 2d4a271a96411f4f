"""Collects what each arm found, op by op, and turns it into a :class:`ReplayStatus`."""

from __future__ import annotations

from operator import itemgetter
from typing import Any

from torchlens.replay.status import OpVerdict, ReplayFailure, ReplayStatus

__all__ = ["Findings"]

_first = itemgetter(0)
_VERIFIED = {"verified"}
_NO_EDGE = "no tensor input: there is no edge for perturbation to prove"
_RANK = {"passed": 0, "exempt": 0, "incomplete": 1, "unverified": 2, "failed": 3}


class Findings:
    """Per-op outcomes of the arms; :meth:`status` summarizes them honestly."""

    def __init__(self, trace: Any) -> None:
        self.op_labels = [op.label for op in trace.ops]
        self.failures: list[ReplayFailure] = []
        self.gaps: list[ReplayFailure] = []
        self.hidden: list[ReplayFailure] = []  # ops reached by a hidden edge: "incomplete"
        self.model_calls = 0  # times validation called the model (see ReplayStatus)
        self.differs_from_itself = False  # two plain calls differed (self_difference.py)
        self._replayed: set[str] = set()
        self._verified: set[str] = set()
        self._exempt: dict[str, tuple[str, ...]] = {}  # exempt op -> why, edge by edge
        self._outputs = set(getattr(trace, "output_labels", ()))
        self._exempt_edges: dict[str, list[str]] = {}  # op -> why each exempt edge is
        self.unread: list[ReplayFailure] = []  # edges no probe could show, exempt by a rule
        self.hidden_edges: list[Any] = []  # dependencies through escapes (completeness arm)
        self.decisions: list[str] = []  # escapes that decide which ops run (completeness arm)

    def fail(self, label: str, arm: str, reason: str) -> None:
        self.failures.append(ReplayFailure(label, arm, reason))

    def unchecked(self, label: str, arm: str, reason: str) -> None:
        self.gaps.append(ReplayFailure(label, arm, reason))

    def incomplete(self, label: str, arm: str, reason: str) -> None:
        """``label`` reads a value through Python that no recorded edge carries: the graph
        is incomplete there (not wrong)."""
        self.hidden.append(ReplayFailure(label, arm, reason))

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
            elif verdict == "exempt":  # a table exempts it without a call
                self._exempt_edges.setdefault(label, []).append(reason)
            elif verdict == "unread":
                self.unread.append(ReplayFailure(label, "perturbation", reason))
        if kinds & {"failed", "unchecked"}:
            return
        if "verified" in kinds:
            self._verified.add(label)
        else:
            self._exempt[label] = tuple(reason for _, reason in verdicts) or (_NO_EDGE,)

    def status(self, arms: tuple[str, ...], unavailable: bool = False) -> ReplayStatus:
        """The summary: ``failed`` > ``unavailable`` > ``unverified`` > ``incomplete`` >
        ``passed``."""
        if self.failures:
            state = "failed"
        elif unavailable:
            state = "unavailable"
        elif self.gaps:
            state = "unverified"
        elif self.hidden:
            state = "incomplete"
        else:
            state = "passed"
        return ReplayStatus(
            state=state,
            ops=len(self.op_labels),
            replayed=len(self._replayed),
            perturbation_verified=len(self._verified),
            exempt=len(self._exempt),
            unverified=len({gap.label for gap in self.gaps}),
            exempt_edges=sum(map(len, self._exempt_edges.values())),
            unread=list(self.unread),
            failures=list(self.failures),
            unchecked=list(self.gaps),
            arms=arms,
            verdicts=self._verdicts(arms),
            exemptions=dict(self._exempt),
            hidden_edges=list(self.hidden_edges),
            decisions=list(self.decisions),
            model_calls=self.model_calls,
        )

    def _verdicts(self, arms: tuple[str, ...]) -> dict[str, OpVerdict]:
        """Each op's outcome per arm: what the arm proved, overruled by what it found (a
        1,000-op trace: about 5 ms, ops with nothing to say copying one prepared dict)."""
        found: dict[str, list[tuple[str, str, str]]] = {}
        for outcome, items in (
            ("failed", self.failures), ("unverified", self.gaps), ("incomplete", self.hidden)
        ):  # fmt: skip
            for item in items:
                found.setdefault(item.label, []).append((item.arm, outcome, item.reason))
        for item in self.unread:  # edges exempt by a rule: not a verdict, a reason
            found.setdefault(item.label, []).append((item.arm, "", item.reason))
        plain: dict[tuple[bool, bool, bool], dict[str, str]] = {}
        verdicts = {}
        for label in self.op_labels:
            key = (label in self._outputs, label in self._replayed, label in self._verified)
            if label not in found and label not in self._exempt_edges and label not in self._exempt:
                outcomes = plain.get(key)
                if outcomes is None:
                    outcomes = plain[key] = self._proved(arms, *key)
                verdicts[label] = OpVerdict(label, dict(outcomes))  # a copy each: picklable
                continue
            proved = self._proved(arms, *key)
            reasons = []
            if label in self._exempt:
                proved["perturbation"] = "exempt"
                if self._exempt[label] == (_NO_EDGE,):
                    reasons.append(f"[perturbation] {_NO_EDGE}")
            reasons += [f"[perturbation] {why}" for why in self._exempt_edges.get(label, ())]
            for arm, outcome, reason in found.get(label, ()):
                if outcome and _RANK[outcome] >= _RANK.get(proved.get(arm, "passed"), 0):
                    proved[arm] = outcome
                reasons.append(f"[{arm}] {reason}")
            ordered = {arm: proved.pop(arm) for arm in arms if arm in proved}
            verdicts[label] = OpVerdict(label, {**ordered, **proved}, tuple(reasons))
        return verdicts

    @staticmethod
    def _proved(arms: tuple[str, ...], output: bool, replayed: bool, verified: bool) -> dict:
        """The arms that passed an op, in the order they ran (before any finding)."""
        passed = {
            "lint": True,
            "ground_truth": output,
            "replay": replayed,
            "perturbation": verified,
        }
        return {arm: "passed" for arm in arms if passed.get(arm)}
