"""``python -m torchlens.backends.conformance [--backend NAME] [--case NAME]``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from torchlens.backends.conformance.cases import CASES, CASES_BY_NAME
from torchlens.backends.conformance.runner import run_conformance
from torchlens.errors import TorchLensError

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the suite, print the table; 0 when every backend conforms, 1 otherwise."""
    parser = argparse.ArgumentParser(
        prog="python -m torchlens.backends.conformance",
        description="Run the backend conformance suite (torch always runs first).",
    )
    parser.add_argument(
        "--backend", action="append", help="registered backend to check (repeatable)"
    )
    parser.add_argument("--case", action="append", choices=sorted(CASES_BY_NAME))
    options = parser.parse_args(argv)
    cases = [CASES_BY_NAME[n] for n in options.case] if options.case else CASES
    try:
        report = run_conformance(options.backend, cases)
    except TorchLensError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(report)
    return 0 if report.passed() else 1


if __name__ == "__main__":
    sys.exit(main())
