"""Benchmarks as ratios measured in one run: ours vs baselines on the same inputs.

Each entry is the median of ``repeats`` timed calls after one warm-up call. Ratios
are what to read; absolute times depend on the machine.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

from gradsift.select import topk_indices

__all__ = ["median_ms", "bench_select"]


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``fn()`` in milliseconds, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def bench_select(sizes=(1_000_000, 11_700_000, 25_000_000), repeats: int = 7, seed: int = 0):
    """``topk_indices(x, k)`` vs ``torch.topk(x.abs(), k)`` vs one ``abs`` pass.

    For each N: k in {1000, 0.1% N, 1% N}, float32 normal data.
    """
    rows = []
    gen = torch.Generator().manual_seed(seed)
    for n in sizes:
        x = torch.randn(n, generator=gen)
        buf = torch.empty_like(x)
        abs_ms = median_ms(lambda: torch.abs(x, out=buf), repeats)  # noqa: B023
        for k in sorted({min(1000, n), max(1, n // 1000), max(1, n // 100)}):
            ours = median_ms(lambda: topk_indices(x, k), repeats)  # noqa: B023
            base = median_ms(lambda: torch.topk(x.abs(), k), repeats)  # noqa: B023
            rows.append(
                {
                    "n": n,
                    "k": k,
                    "ours_ms": ours,
                    "torch_topk_ms": base,
                    "abs_pass_ms": abs_ms,
                    "speedup_vs_topk": base / ours,
                    "ours_over_abs_pass": ours / abs_ms,
                }
            )
    return rows
