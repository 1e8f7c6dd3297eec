"""Timing for benchmarks: medians of repeated calls, interleaved so that drift in the
machine's speed hits every case alike, and ratios as medians of per-round ratios."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

__all__ = ["median_ms", "interleaved_ms", "ratio"]


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``fn()`` in milliseconds, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def interleaved_ms(cases: dict, repeats: int) -> dict[str, list[float]]:
    """Times in ms of each ``(setup, fn)`` in ``cases``, ``repeats`` rounds.

    Every round runs each case once (``setup()`` untimed before it); one warm-up
    call each first.
    """
    for setup, fn in cases.values():
        setup()
        fn()
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, (setup, fn) in cases.items():
            setup()
            start = time.perf_counter()
            fn()
            times[name].append(1e3 * (time.perf_counter() - start))
    return times


def ratio(num: list[float], den: list[float]) -> float:
    """Median over rounds of the per-round ratio (robust to drift between rounds)."""
    return statistics.median(a / b for a, b in zip(num, den))
