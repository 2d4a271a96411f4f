"""What the completeness arm adds to ``tl.validate``, in forwards, on zoo models with escapes.

Issue 38's target: on the real-model zoo (``tests/realworld/cases.py``), the median validate
cost of the models whose forward has escapes (``.item()``, ``if mask.all():``...) rises by
at most one forward. Each round times, in turn, a plain forward (twice: cold, as
``bench_realworld.py`` times it in its rotation, then warm), ``tl.validate`` (adding up the
time spent in the arm: its first look, run before the capture, and the rest after it), and
``tl.validate`` with the arm switched off (no escape count in the ground-truth rerun either).
The arm's own time is the headline; validate with it less validate without it is the check
that nothing else moved (it is noisier: a difference of two totals ten times larger).
Figures are medians over rounds, then over models. Times are the thread's CPU time on one
torch thread, as in ``bench_validate.py``; the garbage collector runs before each
validation, never while timing.

Run (in an environment with the ``zoo`` extra): ``python benchmarks/bench_completeness.py
[--repeats N] [--only NAME ...]``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import statistics
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "tests" / "realworld"))

from cases import CASES, missing_packages  # noqa: E402

import torchlens as tl  # noqa: E402

TARGET = 1.0  # forwards added, median over the models with escapes


class Row(NamedTuple):
    """One model. Ratios are medians over rounds; ``*_fwd`` columns count forwards."""

    model: str
    escapes: int
    forward_ms: float  # warm
    validate_x: float  # against the cold forward, as bench_realworld.py reports it
    arm_cold_fwd: float  # the arm's own time (first look and the rest), in cold forwards
    arm_warm_fwd: float  # the same, in warm forwards
    with_less_without: float  # validate with the arm less validate without it, warm


WIDTHS = (34, 8, 11, 11, 13, 13, 18)
_api = importlib.import_module("torchlens.replay.api")


@contextlib.contextmanager
def arm_off() -> Iterator[None]:
    """``tl.validate`` as it would be without the completeness arm (for this timing only)."""
    saved = _api.rerun, _api.look_first, _api.check_completeness
    _api.rerun = lambda *args: (saved[0](*args[:6]), None)  # no escape count
    _api.look_first = lambda *args: None
    _api.check_completeness = lambda *args: ([], [], 0)
    try:
        yield
    finally:
        _api.rerun, _api.look_first, _api.check_completeness = saved


class ArmClock:
    """Adds up the thread CPU time spent in the arm's two parts while it is installed."""

    def __init__(self) -> None:
        self.seconds = 0.0

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        saved = _api.look_first, _api.check_completeness
        _api.look_first, _api.check_completeness = map(self._timed, saved)
        try:
            yield
        finally:
            _api.look_first, _api.check_completeness = saved

    def _timed(self, part):
        def timed(*args):
            start = time.thread_time()
            try:
                return part(*args)
            finally:
                self.seconds += time.thread_time() - start

        return timed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=7, help="interleaved rounds per model")
    parser.add_argument("--only", nargs="+", help="case names (substrings) to time")
    opts = parser.parse_args(argv)
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    rows: list[Row] = []
    print(" ".join(f"{name:>{width}}" for name, width in zip(Row._fields, WIDTHS)))
    for case in CASES:
        if opts.only and not any(name in case.name for name in opts.only):
            continue
        if "mutates_input" in case.tags or missing_packages(case):
            continue
        try:
            row = _bench(case, opts.repeats)
        except Exception as error:  # noqa: BLE001 - reported, the others still run
            print(f"{case.name}: not timed, {type(error).__name__}: {error}")
            continue
        if row is not None:
            rows.append(row)
            print(" ".join(_cell(value, width) for value, width in zip(row, WIDTHS)), flush=True)
    if not rows:
        print("no model with escapes was timed")
        return 1
    medians = Row("median", *(statistics.median(column) for column in list(zip(*rows))[1:]))
    print(" ".join(_cell(value, width) for value, width in zip(medians, WIDTHS)))
    print(
        f"{len(rows)} models with escapes. The completeness arm adds a median "
        f"{medians.arm_cold_fwd:.2f} forwards timed as bench_realworld.py times the forward "
        f"(cold, in the rotation), {medians.arm_warm_fwd:.2f} warm forwards "
        f"({medians.with_less_without:.2f} as validate with it less validate without it). "
        f"Target at most {TARGET:.0f}: "
        f"{'met' if medians.arm_cold_fwd <= TARGET else 'missed'} against the cold forward, "
        f"{'met' if medians.arm_warm_fwd <= TARGET else 'missed'} against the warm one."
    )
    return 0


def _cell(value: object, width: int) -> str:
    return f"{value:>{width}.2f}" if isinstance(value, float) else f"{value!s:>{width}}"


def _bench(case, repeats: int) -> Row | None:
    """One model's row (None when its forward has no escape)."""
    model, args, kwargs = case.build()
    escapes = len(tl.trace(model, args, kwargs).escapes)
    if not escapes:
        return None
    clock = ArmClock()

    def validate() -> None:
        with clock.installed():
            tl.validate(model, args, kwargs)

    def without() -> None:
        with arm_off():
            tl.validate(model, args, kwargs)

    arm: list[float] = []

    def timed_validate() -> None:
        clock.seconds = 0.0
        validate()
        arm.append(clock.seconds)

    times = _interleaved(
        {"forward": lambda: model(*args, **kwargs), "validate": timed_validate, "without": without},
        repeats,
    )
    warm, cold = times["forward"], times["cold forward"]

    def median(numerators: list[float], forwards: list[float]) -> float:
        return statistics.median(n / f for n, f in zip(numerators, forwards))

    differences = [v - w for v, w in zip(times["validate"], times["without"])]
    arm = arm[1:]  # (not the warm-up round's)
    return Row(
        case.name, escapes, statistics.median(warm) * 1e3,
        median(times["validate"], cold), median(arm, cold), median(arm, warm),
        median(differences, warm),
    )  # fmt: skip


def _interleaved(fns: dict, repeats: int) -> dict[str, list[float]]:
    """Each function's thread CPU time, one per round, all of them in turn every round.

    The cyclic garbage collector is held off while timing and run before each validation
    (a collection costs about a forward here, and where it fell would decide which variant
    pays for it). The forward is timed twice in a row: cold, straight after the previous
    round's validations as ``bench_realworld.py`` times it, and warm (the lower figure, so
    ratios to it are the higher ones)."""
    times: dict[str, list[float]] = {name: [] for name in (*fns, "cold forward")}
    gc.disable()
    try:
        for _ in range(repeats + 1):  # the first round warms up
            for name, fn in fns.items():
                if name == "forward":
                    times["cold forward"].append(_timed(fn))
                else:
                    gc.collect()
                times[name].append(_timed(fn))
    finally:
        gc.enable()
    return {name: values[1:] for name, values in times.items()}


def _timed(fn) -> float:
    start = time.thread_time()
    fn()
    return time.thread_time() - start


if __name__ == "__main__":
    torch.manual_seed(0)
    raise SystemExit(main())
