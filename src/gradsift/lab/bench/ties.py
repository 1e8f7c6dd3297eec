"""``gradsift bench ties``: selection when many keys tie at the cut, and the TopK step
on a 99%-pruned model (whose gradients are 99% exact zeros).

Rows: ``topk_indices`` vs ``torch.topk(x.abs(), k)`` on N all-equal values and on
zeros with a few spikes; then ``TopK(SGD)`` + error feedback on ResNet-18 shapes with
99% of every tensor's gradient zero vs the same step unpruned, interleaved.
"""

from __future__ import annotations

import statistics

import torch

from gradsift import TopK, topk_indices
from gradsift.budget import resolve_k
from gradsift.lab.bench.step import resnet18_shapes
from gradsift.lab.bench.timing import interleaved_ms, median_ms, ratio
from gradsift.lab.tables import columns

__all__ = ["bench_ties", "COLUMNS"]

COLUMNS = columns(
    """
    case            case
    n               N               d
    k               k               d
    ours_ms         ours ms         .2f
    baseline_ms     baseline ms     .2f
    ours_over_base  ours/baseline   .2f
    """
)


def _data(kind: str, n: int, gen) -> torch.Tensor:
    if kind == "all-equal":
        return torch.full((n,), 0.5)
    x = torch.zeros(n)
    spikes = torch.randint(0, n, (max(1, n // 10_000),), generator=gen)
    x[spikes] = torch.randn(spikes.numel(), generator=gen)
    return x


def _selection_rows(n: int, repeats: int, gen) -> list[dict]:
    rows = []
    for kind in ("all-equal", "zeros+spikes"):
        x = _data(kind, n, gen)
        for k in sorted({1000, n // 1000, n // 100}):
            ours = median_ms(lambda: topk_indices(x, k), repeats)  # noqa: B023
            base = median_ms(lambda: torch.topk(x.abs(), k), repeats)  # noqa: B023
            rows.append(
                {
                    "case": f"select {kind} vs torch.topk",
                    "n": n,
                    "k": k,
                    "ours_ms": ours,
                    "baseline_ms": base,
                    "ours_over_base": ours / base,
                }
            )
    return rows


def _step_row(density: float, repeats: int, gen, shapes) -> dict:
    """The pruned model's step vs the unpruned one's (``baseline``), interleaved."""
    grads = [torch.randn(s, generator=gen) for s in shapes]
    pruned = [g * (torch.rand(g.shape, generator=gen) < 0.01) for g in grads]
    cases = {}
    for name, source in (("pruned", pruned), ("dense", grads)):
        ps = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in shapes]
        for p, g in zip(ps, source):
            p.grad = g.clone()  # before TopK: it lays them out as views of its buffer
        opt = TopK(torch.optim.SGD(ps, lr=1e-3), density=density)

        def refill(ps=ps, source=source):
            for p, g in zip(ps, source):
                p.grad.copy_(g)  # in place: keeps TopK's flat-buffer views

        cases[name] = (refill, opt.step)
    t = interleaved_ms(cases, repeats)
    n = sum(g.numel() for g in grads)
    return {
        "case": "TopK step, 99% pruned vs unpruned",
        "n": n,
        "k": resolve_k(n, density=density),
        "ours_ms": statistics.median(t["pruned"]),
        "baseline_ms": statistics.median(t["dense"]),
        "ours_over_base": ratio(t["pruned"], t["dense"]),
    }


def bench_ties(n: int = 30_000_000, repeats: int = 5, seed: int = 0, shapes=None) -> list[dict]:
    gen = torch.Generator().manual_seed(seed)
    shapes = shapes or resnet18_shapes()
    rows = _selection_rows(n, repeats, gen)
    return rows + [_step_row(d, repeats, gen, shapes) for d in (0.001, 0.01)]
