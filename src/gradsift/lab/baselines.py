"""Straightforward transcriptions of what research code does, kept as baselines.

Used by the benchmarks (speed and memory) and by the tests (agreement). Not for
production use: they mutate ``.grad`` and assume Conv/Linear weights.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

__all__ = ["reference_grasp", "naive_topk_step"]


def reference_grasp(model: nn.Module, x: torch.Tensor, y: torch.Tensor, temperature=200.0):
    """GraSP as in the authors' code (Wang et al. 2020, arXiv:2002.07376).

    Two half-batches: first-order gradients of each half summed into ``g``; then per
    half a ``create_graph`` pass, ``z = gᵀ∇L``, ``z.backward()`` accumulating ``Hg``.
    Returns the paper's ``-θ ⊙ Hg`` (removed-highest) keyed by parameter name. Its
    ``g`` and ``Hg`` are sums of two half-batch means: 4x ours, same ranking.
    """
    net = copy.deepcopy(model)
    net.zero_grad()
    names = [n + ".weight" for n, m in net.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    weights = [net.get_parameter(n) for n in names]
    for w in weights:
        w.requires_grad_(True)
    n = x.shape[0]
    halves = [(x[: n // 2], y[: n // 2]), (x[n // 2 :], y[n // 2 :])]
    grad_w = None
    for xs, ys in halves:
        loss = F.cross_entropy(net(xs) / temperature, ys)
        g = torch.autograd.grad(loss, weights)
        grad_w = list(g) if grad_w is None else [a + b for a, b in zip(grad_w, g)]
    for xs, ys in halves:
        loss = F.cross_entropy(net(xs) / temperature, ys)
        grad_f = torch.autograd.grad(loss, weights, create_graph=True)
        z = sum((gw * gf).sum() for gw, gf in zip(grad_w, grad_f))
        z.backward()
    return {name: -w.detach() * w.grad for name, w in zip(names, weights)}


def naive_topk_step(params, sgd, k: int) -> None:
    """What research code does: cat every grad, ``torch.topk``, build a mask, write
    back, then the optimizer's dense step (no error feedback)."""
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    idx = torch.topk(flat.abs(), k).indices
    mask = torch.zeros_like(flat)
    mask[idx] = 1.0
    offset = 0
    for p in params:
        p.grad.mul_(mask[offset : offset + p.numel()].view_as(p))
        offset += p.numel()
    sgd.step()
