"""Shared timing helpers for the benchmarks: medians of repeated runs after a warm-up."""

from __future__ import annotations

import ctypes
import ctypes.util
import statistics
import time
from collections.abc import Callable

import torch


def pin_allocator() -> bool:
    """Fix glibc's mmap and trim thresholds for the rest of the process.

    glibc raises its mmap threshold the first time a large block it mapped is freed: from
    then on, activations come from the heap instead of fresh zeroed pages, and a forward of
    convnet8 at batch 32 runs about 30% faster. Which arm of an interleaved run triggers
    that first shifts every ratio after it (tl.extract against a hook loop moved from 1.0 to
    1.2 so); pinned, all arms run under the same allocator. Returns whether it was pinned
    (not on a C library without ``mallopt``).
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
    return bool(mallopt(m_mmap_threshold, 64 << 20)) and bool(mallopt(m_trim_threshold, 128 << 20))


def median_seconds(fn: Callable[[], object], repeats: int = 20, warmup: int = 3) -> float:
    """Median wall time of ``fn()`` over ``repeats`` runs, after ``warmup`` untimed runs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def interleaved_times(
    fns: dict[str, Callable[[], object]],
    repeats: int = 20,
    warmup: int = 3,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, list[float]]:
    """Each function's time by ``clock``, one per round; every round runs them all in turn,
    so drift on a shared machine hits all alike and ratios can be taken round by round."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = clock()
            fn()
            times[name].append(clock() - start)
    return times


def interleaved_medians(
    fns: dict[str, Callable[[], object]], repeats: int = 20, warmup: int = 3
) -> dict[str, float]:
    """Median wall time of each function, runs interleaved (see :func:`interleaved_times`)."""
    times = interleaved_times(fns, repeats, warmup)
    return {name: statistics.median(ts) for name, ts in times.items()}


def interleaved_ratios(
    fns: dict[str, Callable[[], object]], base: str, repeats: int = 20, warmup: int = 3
) -> dict[str, float]:
    """Median over rounds of each function's time divided by ``base``'s in the same round.

    On a shared machine whose speed drifts by tens of percent between seconds, a ratio taken
    within one round is steadier than a ratio of medians taken over the whole run.
    """
    times = interleaved_times(fns, repeats, warmup)
    return {
        name: statistics.median(t / b for t, b in zip(ts, times[base]))
        for name, ts in times.items()
    }


def synchronized(run: Callable[[], object]) -> Callable[[], None]:
    """``run`` followed by a wait for every queued CUDA kernel: on a GPU a call returns once
    its kernels are queued, so a timing without the wait misses them."""

    def timed() -> None:
        run()
        torch.cuda.synchronize()

    return timed
