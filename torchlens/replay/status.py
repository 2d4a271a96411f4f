"""What validation found: :class:`ReplayStatus`, the one result every validation entry returns.

The state is honest by construction: it is ``passed`` only when every check that was asked
for ran and held. Anything that could not be checked keeps the state at ``unverified``; a
trace without values is ``unavailable``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ReplayFailure", "ReplayStatus", "STATES", "ARMS"]

STATES = ("passed", "failed", "unverified", "unavailable")
ARMS = ("lint", "ground_truth", "replay", "perturbation", "completeness")


@dataclass(frozen=True)
class ReplayFailure:
    """One finding: which record, which arm, and why."""

    label: str  # the op, source or output label concerned
    arm: str  # "lint" | "ground_truth" | "replay" | "perturbation"
    reason: str  # what was observed, in words

    def __str__(self) -> str:
        return f"{self.label} [{self.arm}]: {self.reason}"


@dataclass
class ReplayStatus:
    """The result of replay validation.

    ``bool(status)`` is True only when ``state == "passed"``.

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
    # dependencies through escapes (.item(), .tolist()...) that the graph has no edge for,
    # as torchlens.trace.HiddenEdge; each is also a failure of the completeness arm
    hidden_edges: list = field(default_factory=list)
    # escapes whose value decides which ops run (if t.any():, assert), with their lines:
    # the recorded graph is the branch taken, so they are noted, not failed
    decisions: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.state not in STATES:
            raise ValueError(f"state must be one of {STATES}, got {self.state!r}")

    def __bool__(self) -> bool:
        return self.state == "passed"

    def __repr__(self) -> str:
        return (
            f"ReplayStatus(state={self.state!r}, ops={self.ops}, replayed={self.replayed}, "
            f"perturbation_verified={self.perturbation_verified}, exempt={self.exempt}, "
            f"unverified={self.unverified}, failures={len(self.failures)})"
        )

    def __str__(self) -> str:
        lines = [
            f"ReplayStatus: {self.state} ({self.ops} ops: {self.replayed} replayed, "
            f"{self.perturbation_verified} perturbation-verified, {self.exempt} exempt, "
            f"{self.unverified} unverified)",
            f"arms run: {', '.join(self.arms) or '-'}",
        ]
        if self.exempt_edges or self.unread:
            lines.append(
                f"edges exempt: {self.exempt_edges} by kind or table, "
                f"{len(self.unread)} unread by a rule after every probe"
            )
        lines += _section("failures", self.failures)
        if self.decisions:
            lines.append("branch decisions (escapes that decide which ops run; not failures):")
            lines += [f"  {text}" for text in self.decisions[:20]]
        lines += _section("not checked", self.unchecked)
        lines += _section("unread (exempt by a rule)", self.unread)
        return "\n".join(lines)


def _section(title: str, items: list[ReplayFailure], limit: int = 20) -> list[str]:
    if not items:
        return []
    lines = [f"{title}:"] + [f"  {item}" for item in items[:limit]]
    if len(items) > limit:
        lines.append(f"  ... and {len(items) - limit} more")
    return lines
