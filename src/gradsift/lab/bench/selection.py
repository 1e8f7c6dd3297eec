"""``gradsift bench select``: ``topk_indices(x, k)`` vs ``torch.topk(x.abs(), k)`` vs one
``abs`` pass over the same float32 normal data."""

from __future__ import annotations

import torch

from gradsift import topk_indices
from gradsift.lab.bench.timing import median_ms
from gradsift.lab.tables import columns

__all__ = ["bench_select", "COLUMNS", "SIZES"]

SIZES = (1_000_000, 11_700_000, 25_000_000)

COLUMNS = columns(
    """
    n                   N             d
    k                   k             d
    ours_ms             ours ms       .2f
    torch_topk_ms       topk(|x|) ms  .2f
    abs_pass_ms         abs pass ms   .2f
    speedup_vs_topk     topk/ours     .1f
    ours_over_abs_pass  ours/abs      .1f
    """
)


def bench_select(sizes=SIZES, repeats: int = 7, seed: int = 0) -> list[dict]:
    """For each N: k in {1000, 0.1% N, 1% N}; medians of ``repeats`` calls."""
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
