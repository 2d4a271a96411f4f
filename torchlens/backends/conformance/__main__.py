"""``python -m torchlens.backends.conformance [--backend NAME|module:object] [--case NAME]``.

A backend defined in the user's own code is named by its import path
(``--backend my_pkg.backend:MyBackend``) or by an entry point of the ``torchlens.backends``
group; see :func:`torchlens.backends.registry.load_backend`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from torchlens.backends.conformance.cases import CASES, CASES_BY_NAME
from torchlens.backends.conformance.runner import run_conformance
from torchlens.backends.registry import load_backend
from torchlens.errors import TorchLensError

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the suite, print the table; 0 when every backend conforms, 1 otherwise."""
    parser = argparse.ArgumentParser(
        prog="python -m torchlens.backends.conformance",
        description="Run the backend conformance suite (torch always runs first).",
    )
    parser.add_argument(
        "--backend",
        action="append",
        help="backend to check (repeatable): a registered name, package.module:object, or "
        "an entry point of the torchlens.backends group",
    )
    parser.add_argument("--case", action="append", choices=sorted(CASES_BY_NAME))
    options = parser.parse_args(argv)
    cases = [CASES_BY_NAME[n] for n in options.case] if options.case else CASES
    try:
        names = [load_backend(b).name for b in options.backend] if options.backend else None
        report = run_conformance(names, cases)
    except TorchLensError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(report)
    return 0 if report.passed() else 1


if __name__ == "__main__":
    sys.exit(main())
