"""``gradsift bench step``: the ``TopK(SGD)`` + error-feedback step vs dense
``SGD(foreach=True)`` vs the naive method, interleaved, on ResNet-18 parameter shapes."""

from __future__ import annotations

import statistics
from functools import partial

import torch

from gradsift import TopK
from gradsift.budget import resolve_k
from gradsift.lab.baselines import naive_topk_step
from gradsift.lab.bench.timing import interleaved_ms, ratio
from gradsift.lab.tables import columns

__all__ = ["bench_step", "resnet18_shapes", "COLUMNS"]

COLUMNS = columns(
    """
    density                       density                    g
    k                             k                          d
    topk_ef_ms                    TopK+EF ms                 .2f
    dense_sgd_ms                  dense SGD ms               .2f
    naive_ms                      naive ms                   .1f
    ours_over_dense               ours/dense                 .2f
    naive_over_ours               naive/ours                 .1f
    other_extra_over_param_bytes  (extra - residual)/params  .3f
    """
)


def resnet18_shapes() -> list[tuple[int, ...]]:
    """Parameter shapes of torchvision's ResNet-18 (ImageNet head): 62 tensors, 11.69M."""
    shapes: list[tuple[int, ...]] = [(64, 3, 7, 7), (64,), (64,)]
    cin = 64
    for cout, down in ((64, False), (128, True), (256, True), (512, True)):
        for b in range(2):
            c0 = cin if b == 0 else cout
            shapes += [(cout, c0, 3, 3), (cout,), (cout,), (cout, cout, 3, 3), (cout,), (cout,)]
            if b == 0 and down:
                shapes += [(cout, c0, 1, 1), (cout,), (cout,)]
        cin = cout
    return shapes + [(1000, 512), (1000,)]


def bench_step(densities=(0.001, 0.01), repeats: int = 15, seed: int = 0, shapes=None):
    """Times are medians; ratios are medians of the per-round ratios."""
    gen = torch.Generator().manual_seed(seed)
    shapes = shapes or resnet18_shapes()
    grads = [torch.randn(s, generator=gen) for s in shapes]

    def fresh():
        ps = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in shapes]
        for p, g in zip(ps, grads):
            p.grad = g.clone()
        return ps

    def refill(ps):
        def setup():
            for p, g in zip(ps, grads):
                p.grad.copy_(g)  # in place: keeps TopK's flat-buffer views

        return setup

    n = sum(g.numel() for g in grads)
    param_bytes = sum(g.numel() * g.element_size() for g in grads)
    dense_ps = fresh()
    dense = torch.optim.SGD(dense_ps, lr=1e-3, foreach=True)
    rows = []
    for density in densities:
        k = resolve_k(n, density=density)
        ps, naive_ps = fresh(), fresh()
        opt = TopK(torch.optim.SGD(ps, lr=1e-3, foreach=True), density=density)
        sgd = torch.optim.SGD(naive_ps, lr=1e-3, foreach=True)
        t = interleaved_ms(
            {
                "ours": (refill(ps), opt.step),
                "dense": (refill(dense_ps), dense.step),
                "naive": (refill(naive_ps), partial(naive_topk_step, naive_ps, sgd, k)),
            },
            repeats,
        )
        memory = opt.memory_bytes()
        rows.append(
            {
                "n": n,
                "tensors": len(shapes),
                "density": density,
                "k": k,
                "topk_ef_ms": statistics.median(t["ours"]),
                "dense_sgd_ms": statistics.median(t["dense"]),
                "naive_ms": statistics.median(t["naive"]),
                "ours_over_dense": ratio(t["ours"], t["dense"]),
                "naive_over_ours": ratio(t["naive"], t["ours"]),
                "residual_bytes": memory["state"],
                "other_extra_bytes": memory["workspace"],
                "other_extra_over_param_bytes": memory["workspace"] / param_bytes,
            }
        )
    return rows
