"""Trace and validate cost on the real-model zoo (``tests/realworld/cases.py``), per family.

For each model whose packages import here, one interleaved timing per round of a plain
forward, ``tl.trace`` and ``tl.validate``; a model's ratio is the median over rounds of the
per-round ratio to the forward (see ``timing.interleaved_ratios``), and a family's figure is
the median over its models. Models whose forward mutates its inputs (a cache passed in) are
left out: repeating the call would time a different forward each round. A model that does not
validate ``passed`` is still timed, and marked ``*`` in the per-model table; one whose
validation raises is listed as an error and left out of the medians.

Run (in an environment with the ``zoo`` extra): ``python benchmarks/bench_realworld.py
[--repeats N] [--family F] [--per-model] [--threads N]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "tests" / "realworld"))

from cases import CASES, FAMILIES, missing_packages  # noqa: E402
from timing import interleaved_ratios, median_seconds  # noqa: E402

import torchlens as tl  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5, help="interleaved rounds per model")
    parser.add_argument("--family", choices=FAMILIES, action="append")
    parser.add_argument("--per-model", action="store_true", help="print every model's row")
    parser.add_argument(
        "--threads",
        type=int,
        help="torch intra-op threads (1 keeps ratios steady on a shared machine, where "
        "threads waiting for a busy core make one forward take 10-50x longer)",
    )
    opts = parser.parse_args(argv)
    if opts.threads:
        torch.set_num_threads(opts.threads)
    warnings.filterwarnings("ignore")
    rows = []
    if opts.per_model:
        print(f"{'model':<40}{'family':<13}{'forward ms':>11}{'trace x':>9}{'validate x':>12}")
    for case in CASES:
        if opts.family and case.family not in opts.family:
            continue
        if "mutates_input" in case.tags or missing_packages(case):
            continue
        try:
            row = (case, *_bench(case, opts.repeats))
        except Exception as error:  # noqa: BLE001 - reported, the others still run
            print(f"{case.name}: not timed, {type(error).__name__}: {error}")
            continue
        rows.append(row)
        if opts.per_model:
            _, forward_ms, trace_x, validate_x, passed = row
            mark = "" if passed else " *"
            print(
                f"{case.name:<40}{case.family:<13}{forward_ms:>11.1f}{trace_x:>9.2f}"
                f"{validate_x:>12.2f}{mark}",
                flush=True,
            )
    print()
    print(f"{'family':<13}{'models':>7}{'median trace x':>16}{'median validate x':>19}")
    for family in FAMILIES:
        got = [row for row in rows if row[0].family == family]
        if not got:
            continue
        trace_x = statistics.median(row[2] for row in got)
        validate_x = statistics.median(row[3] for row in got)
        print(f"{family:<13}{len(got):>7}{trace_x:>16.2f}{validate_x:>19.2f}")
    if rows:  # the zoo's median model (bench_validate.py's LRN targets are this figure)
        trace_x = statistics.median(row[2] for row in rows)
        validate_x = statistics.median(row[3] for row in rows)
        print(f"{'all':<13}{len(rows):>7}{trace_x:>16.2f}{validate_x:>19.2f}")
    return 0


def _bench(case, repeats: int) -> tuple[float, float, float, bool]:
    """One model: forward ms, trace / forward, validate / forward, whether it passed."""
    model, args, kwargs = case.build()
    passed = tl.validate(model, args, kwargs)
    forward_ms = median_seconds(lambda: model(*args, **kwargs), repeats=3, warmup=1) * 1e3
    ratios = interleaved_ratios(
        {
            "forward": lambda: model(*args, **kwargs),
            "trace": lambda: tl.trace(model, args, kwargs),
            "validate": lambda: tl.validate(model, args, kwargs),
        },
        base="forward",
        repeats=repeats,
        warmup=1,
    )
    return forward_ms, ratios["trace"], ratios["validate"], passed


if __name__ == "__main__":
    torch.manual_seed(0)
    raise SystemExit(main())
