"""The conformance runner: eager reference -> capture -> oracles, torch first.

Torch is run on every case before any other backend. An oracle counts for another backend
only where torch passed it; elsewhere that backend's outcome is ``not_comparable``, because
a check the reference fails says nothing about the backend under test.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from torchlens._table import format_table
from torchlens.backends.conformance.cases import CASES, ConformanceCase
from torchlens.backends.conformance.oracles import ORACLES, CaseRun, OracleResult
from torchlens.backends.protocol import BackendProtocol
from torchlens.backends.registry import REFERENCE_BACKEND, backend_specs, get_backend_spec

__all__ = ["ConformanceReport", "Outcome", "run_case", "run_conformance"]


@dataclass(frozen=True)
class Outcome:
    """The verdict of one oracle on one case for one backend."""

    backend: str
    case: str
    oracle: str
    state: str  # "passed" | "failed" | "not_comparable"
    detail: str = ""


@dataclass(frozen=True)
class ConformanceReport:
    """Every outcome of a conformance run; ``print(report)`` shows the table."""

    backends: tuple[str, ...]  # torch first
    outcomes: tuple[Outcome, ...]

    def failures(self, backend: str | None = None) -> list[Outcome]:
        """Failed outcomes, for one backend or for all."""
        return [
            o
            for o in self.outcomes
            if o.state == "failed" and (backend is None or o.backend == backend)
        ]

    def passed(self, backend: str | None = None) -> bool:
        """True when ``backend`` (or every backend) failed no comparable oracle."""
        return not self.failures(backend)

    def state(self, backend: str, case: str, oracle: str) -> str:
        """The state of one cell of the table."""
        for o in self.outcomes:
            if (o.backend, o.case, o.oracle) == (backend, case, oracle):
                return o.state
        raise KeyError((backend, case, oracle))

    def __str__(self) -> str:
        cells = {(o.backend, o.case, o.oracle): o.state for o in self.outcomes}
        cases = list(dict.fromkeys(o.case for o in self.outcomes))
        rows = [
            (backend, case, *(cells.get((backend, case, name), "-") for name in ORACLES))
            for backend in self.backends
            for case in cases
        ]
        lines = [format_table(("backend", "case", *ORACLES), rows), ""]
        for backend in self.backends:
            n_failed = len(self.failures(backend))
            verdict = "conforms" if n_failed == 0 else f"FAILS ({n_failed} failed checks)"
            lines.append(f"{backend}: {verdict}")
        for o in self.failures():
            lines.append(f"  {o.backend} / {o.case} / {o.oracle}: {o.detail}")
        return "\n".join(lines)


def run_conformance(
    backends: Iterable[str | BackendProtocol] | None = None,
    cases: Sequence[ConformanceCase] = CASES,
) -> ConformanceReport:
    """Run ``cases`` through torch and then through each other backend.

    Args:
        backends: registered names or protocol objects; ``None`` means every registered
            backend. Torch is always run first, as the reference, even if not listed.
        cases: the corpus; defaults to :data:`~torchlens.backends.conformance.cases.CASES`.

    Returns:
        A :class:`ConformanceReport`.

    Raises:
        UnknownBackendError: a name is not registered.

    Example:
        >>> from torchlens.backends.conformance.cases import CASES_BY_NAME
        >>> report = run_conformance(["torch"], [CASES_BY_NAME["mlp"]])
        >>> report.state("torch", "mlp", "inventory")
        'passed'
    """
    chosen = [spec.name for spec in backend_specs()] if backends is None else list(backends)
    protocols = [get_backend_spec(b).protocol() if isinstance(b, str) else b for b in chosen]
    torch_backend = next((p for p in protocols if p.name == REFERENCE_BACKEND), None)
    if torch_backend is None:
        torch_backend = get_backend_spec(REFERENCE_BACKEND).protocol()
    others = [p for p in protocols if p is not torch_backend and p.name != REFERENCE_BACKEND]
    reference = [o for case in cases for o in _run_backend(torch_backend, case)]
    accepted = {(o.case, o.oracle) for o in reference if o.state == "passed"}
    outcomes = list(reference)
    for protocol in others:
        for case in cases:
            outcomes += _run_backend(protocol, case, accepted)
    names = (REFERENCE_BACKEND, *(p.name for p in others))
    return ConformanceReport(names, tuple(outcomes))


def run_case(protocol: BackendProtocol, case: ConformanceCase) -> CaseRun:
    """Build the case, run the reference arm and capture, on forked, seeded RNG.

    The model is built once; inputs are rebuilt from the same seed for each arm (a forward may
    modify them), and both arms start from the same RNG state, so stochastic cases agree.
    The caller's global RNG state is left as it was.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(case.seed)
        model = case.make_model()
        torch.manual_seed(case.seed + 1)
        args, kwargs = case.make_inputs()
        torch.manual_seed(case.seed + 2)
        reference = protocol.reference_output(model, args, kwargs)
        torch.manual_seed(case.seed + 1)
        args, kwargs = case.make_inputs()
        torch.manual_seed(case.seed + 2)
        captured = protocol.capture(model, args, kwargs)
    return CaseRun(case, reference, captured)


def _run_backend(
    protocol: BackendProtocol,
    case: ConformanceCase,
    accepted: set[tuple[str, str]] | None = None,
) -> list[Outcome]:
    """One backend on one case: every oracle, or the error that stopped the run."""
    comparable = [n for n in ORACLES if accepted is None or (case.name, n) in accepted]
    outcomes = [
        Outcome(protocol.name, case.name, n, "not_comparable", "torch fails this check")
        for n in ORACLES
        if n not in comparable
    ]
    if not comparable:
        return outcomes
    try:
        run = run_case(protocol, case)
    except Exception as err:  # a backend that cannot run the case fails it
        detail = f"run raised {type(err).__name__}: {err}"
        outcomes += [Outcome(protocol.name, case.name, n, "failed", detail) for n in comparable]
    else:
        for name in comparable:
            result = _judge(name, protocol, run)
            outcomes.append(Outcome(protocol.name, case.name, name, result.state, result.detail))
    return sorted(outcomes, key=lambda o: list(ORACLES).index(o.oracle))


def _judge(name: str, protocol: BackendProtocol, run: CaseRun) -> OracleResult:
    try:
        return ORACLES[name](protocol, run)
    except Exception as err:  # an oracle that crashes on a run is a failed check
        return OracleResult("failed", f"{type(err).__name__}: {err}")
