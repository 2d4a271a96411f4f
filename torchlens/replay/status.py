"""What validation found: :class:`ReplayStatus`, the one result every validation entry returns.

The state is honest by construction: it is ``passed`` only when every check that was asked
for ran and held. Dependencies proven to pass through Python values (hidden edges) make it
``incomplete``: what was recorded is right, the graph is missing those edges. Anything that
could not be checked keeps the state at ``unverified``; a trace without values is
``unavailable``; ``failed`` is kept for a recorded value, edge or function that is wrong.
Beside the counts, :attr:`ReplayStatus.verdicts` gives each op's :class:`OpVerdict`, arm by
arm.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["OpVerdict", "ReplayFailure", "ReplayStatus", "STATES", "ARMS", "OUTCOMES"]

STATES = ("passed", "incomplete", "failed", "unverified", "unavailable")
ARMS = ("lint", "ground_truth", "replay", "perturbation", "completeness")
# what one arm concluded about one op: "exempt" is the perturbation arm's "nothing to prove";
# "incomplete" is the completeness arm's: the op reads a value through Python (a hidden edge)
OUTCOMES = ("passed", "exempt", "incomplete", "unverified", "failed")


@dataclass(frozen=True)
class ReplayFailure:
    """One finding: which record, which arm, and why."""

    label: str  # the op, source or output label concerned
    arm: str  # "lint" | "ground_truth" | "replay" | "perturbation" | "completeness"
    reason: str  # what was observed, in words

    def __str__(self) -> str:
        return f"{self.label} [{self.arm}]: {self.reason}"


@dataclass(frozen=True)
class OpVerdict:
    """What each arm concluded about one op: ``status.verdicts["linear_2"]``.

    Example:
        >>> v = OpVerdict("relu_1", {"replay": "passed", "perturbation": "exempt"},
        ...               ("[perturbation] no tensor input",))
        >>> v.state, v.arms["perturbation"]
        ('passed', 'exempt')
    """

    label: str  # the op's label
    arms: Mapping[str, str]  # arm -> one of OUTCOMES; only the arms that looked at this op
    reasons: tuple[str, ...] = ()  # "[arm] why", for every outcome but a plain pass

    @property
    def state(self) -> str:
        """``failed`` if any arm failed, else ``unverified`` if any could not check, else
        ``incomplete`` if it reads a value through Python (a hidden edge), else ``passed``
        (an exempt op passes: there was nothing to prove)."""
        outcomes = set(self.arms.values())
        for state in ("failed", "unverified", "incomplete"):
            if state in outcomes:
                return state
        return "passed"

    def __str__(self) -> str:
        arms = ", ".join(f"{arm} {outcome}" for arm, outcome in self.arms.items())
        why = "".join(f"\n  {reason}" for reason in self.reasons)
        return f"{self.label}: {self.state} ({arms}){why}"


@dataclass
class ReplayStatus:
    """The result of replay validation.

    ``bool(status)`` is True only when ``state == "passed"``; :meth:`accepted` also takes
    ``incomplete`` (hidden edges only) when the caller accepts what was found.

    Example:
        >>> status = ReplayStatus("passed", ops=2, replayed=2, perturbation_verified=2)
        >>> bool(status), status.exempt, status.failures
        (True, 0, [])
        >>> bool(ReplayStatus("unverified"))
        False
    """

    state: str  # one of STATES
    ops: int = 0  # ops in the trace
    replayed: int = 0  # ops whose per-op replay reproduced the saved value
    perturbation_verified: int = 0  # ops whose every non-exempt tensor edge was proved
    exempt: int = 0  # ops with no edge the perturbation arm must prove (see exemptions.py)
    unverified: int = 0  # ops some arm could not check
    exempt_edges: int = 0  # edges exempt without a call (shape-only use, int/bool parents...)
    # edges no probe could show the function reads, exempt by an argument-level rule (an
    # attn_mask beside is_causal=True, a NaN output): neither passed nor failed
    unread: list[ReplayFailure] = field(default_factory=list)
    failures: list[ReplayFailure] = field(default_factory=list)
    unchecked: list[ReplayFailure] = field(default_factory=list)  # why ops are unverified
    arms: tuple[str, ...] = ()  # the arms that ran
    # every op's verdict by label: status.verdicts["linear_2"].arms["perturbation"]
    verdicts: dict[str, OpVerdict] = field(default_factory=dict)
    # the ops counted in `exempt`, each with why the perturbation arm had nothing to prove
    exemptions: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # dependencies through escapes (.item(), .tolist()...) that the graph has no edge for,
    # as torchlens.trace.HiddenEdge: they make the state "incomplete" (not "failed"), and the
    # op each reaches has arms["completeness"] == "incomplete"
    hidden_edges: list = field(default_factory=list)
    # escapes whose value decides which ops run (if t.any():, assert), with their lines:
    # the recorded graph is the branch taken, so they are noted, not failed; and the
    # completeness arm's notes of what it left unchecked, and constants first seen after a
    # torch.func transform (the capture does not record inside one)
    decisions: list[str] = field(default_factory=list)
    # how many times validation called the model (Python-side state a forward advances, a
    # step counter, advanced that many times; see docs/validation.md)
    model_calls: int = 0

    def __post_init__(self) -> None:
        if self.state not in STATES:
            raise ValueError(f"state must be one of {STATES}, got {self.state!r}")

    def __bool__(self) -> bool:
        return self.state == "passed"

    def to_json(self) -> dict:
        """The status as plain JSON data (what ``trace.save`` keeps of ``trace.status``)."""

        def items(found: list[ReplayFailure]) -> list[list[str]]:
            return [[f.label, f.arm, f.reason] for f in found]

        return {
            "state": self.state,
            "counts": [self.ops, self.replayed, self.perturbation_verified, self.exempt,
                       self.unverified, self.exempt_edges],
            "arms": list(self.arms),
            "failures": items(self.failures),
            "unchecked": items(self.unchecked),
            "unread": items(self.unread),
            "decisions": list(self.decisions),
            "model_calls": self.model_calls,
            "exemptions": {label: list(why) for label, why in self.exemptions.items()},
            "verdicts": {
                label: [dict(v.arms), list(v.reasons)] for label, v in self.verdicts.items()
            },
            "hidden_edges": [
                [e.parent, e.child, e.via, None if e.source is None else list(e.source)]
                for e in self.hidden_edges
            ],
        }  # fmt: skip

    @classmethod
    def from_json(cls, data: Mapping) -> ReplayStatus:
        """The status :meth:`to_json` wrote."""
        from torchlens._escapes import HiddenEdge

        def items(rows: list) -> list[ReplayFailure]:
            return [ReplayFailure(str(a), str(b), str(c)) for a, b, c in rows]

        ops, replayed, verified, exempt, unverified, exempt_edges = data["counts"]
        return cls(
            state=str(data["state"]), ops=int(ops), replayed=int(replayed),
            perturbation_verified=int(verified), exempt=int(exempt),
            unverified=int(unverified), exempt_edges=int(exempt_edges),
            unread=items(data["unread"]), failures=items(data["failures"]),
            unchecked=items(data["unchecked"]), arms=tuple(map(str, data["arms"])),
            verdicts={
                str(label): OpVerdict(str(label), dict(arms), tuple(reasons))
                for label, (arms, reasons) in data["verdicts"].items()
            },
            exemptions={str(k): tuple(v) for k, v in data["exemptions"].items()},
            hidden_edges=[
                HiddenEdge(str(p), str(c), str(v), _line(w)) for p, c, v, w in data["hidden_edges"]
            ],
            decisions=list(map(str, data["decisions"])), model_calls=int(data["model_calls"]),
        )  # fmt: skip

    def accepted(self, accept_hidden_edges: bool = False) -> bool:
        """Whether the verdict is one the caller accepts: ``passed``, or, with
        ``accept_hidden_edges``, ``incomplete`` (every recorded op and edge proven; the
        only findings are dependencies through Python values, which the caller knows of).

        Args:
            accept_hidden_edges: also accept ``incomplete``.

        Returns:
            True for ``passed`` (and ``incomplete`` when accepted).

        Example:
            >>> ReplayStatus("incomplete").accepted(), ReplayStatus("incomplete").accepted(True)
            (False, True)
        """
        return self.state == "passed" or (accept_hidden_edges and self.state == "incomplete")

    @property
    def headline(self) -> str:
        """The verdict in words: for ``incomplete``, how many dependencies pass through
        Python values (each is in :attr:`hidden_edges`, with its line)."""
        if self.state != "incomplete":
            return self.state
        n = len(self.hidden_edges)
        return (
            f"incomplete: {n} {'dependency passes' if n == 1 else 'dependencies pass'} through "
            "Python values; every recorded op and edge is proven"
        )

    def __repr__(self) -> str:
        return (
            f"ReplayStatus(state={self.state!r}, ops={self.ops}, replayed={self.replayed}, "
            f"perturbation_verified={self.perturbation_verified}, exempt={self.exempt}, "
            f"unverified={self.unverified}, failures={len(self.failures)})"
        )

    def __str__(self) -> str:
        lines = [
            f"ReplayStatus: {self.headline} ({self.ops} ops: {self.replayed} replayed, "
            f"{self.perturbation_verified} perturbation-verified, {self.exempt} exempt, "
            f"{self.unverified} unverified)",
            "  ops are recorded function calls. replayed: run again from its recorded inputs, "
            "it gave the saved value;",
            "  perturbation-verified: changing each tensor it reads changed its output; exempt: "
            "it reads no tensor",
            "  that needs that proof (status.exemptions says why); unverified: a check could "
            "not run (see below)",
        ]
        if self.exempt_edges or self.unread:
            lines.append(
                "  edges exempt (an edge is one op reading one tensor): "
                f"{self.exempt_edges} need no proof (an integer, boolean or empty tensor, or one "
                f"the op reads only the shape of); {len(self.unread)} changed nothing under any "
                "probe, as a documented rule allows (see unread)"
            )
        lines.append(f"arms run: {', '.join(self.arms) or '-'}")
        if self.model_calls:
            lines.append(
                f"model calls: {self.model_calls} (Python state a forward advances "
                "advanced that many times)"
            )
        lines += _section(
            "hidden edges (dependencies through Python values; the graph has no edge for "
            "them, see trace.hidden_edges)",
            self.hidden_edges,
        )
        lines += _section("failures", self.failures)
        if self.decisions:
            lines.append(
                "branch decisions (escapes that decide which ops run) and the completeness "
                "arm's notes; not failures:"
            )
            lines += [f"  {text}" for text in self.decisions[:20]]
        lines += _section("not checked", self.unchecked)
        lines += _section("unread (exempt by a rule)", self.unread)
        return "\n".join(lines)


def _line(where: Any) -> tuple[str, int, str] | None:
    return None if where is None else (str(where[0]), int(where[1]), str(where[2]))


def _section(title: str, items: list[Any], limit: int = 20) -> list[str]:
    if not items:
        return []
    lines = [f"{title}:"] + [f"  {item}" for item in items[:limit]]
    if len(items) > limit:
        lines.append(f"  ... and {len(items) - limit} more")
    return lines
