"""Gradients and Hessian-gradient products over chunks, for GraSP (private helpers).

``Hg`` is taken reverse-over-reverse (``∇(gᵀ∇L)`` through a ``create_graph``
backward, as the GraSP authors do) or forward-over-reverse (``torch.func.jvp`` of
``torch.func.grad``): the same values by an independent route.
"""

from __future__ import annotations

import torch
from torch import nn


def add_(acc: list[torch.Tensor], parts) -> None:
    for a, p in zip(acc, parts):
        a += p


def gradient(model, leaves, weighted, chunks, keep):
    """``g = ∇L`` over all chunks; where ``keep[i]``, chunk i's gradient is taken with
    ``create_graph`` and returned in ``kept[i]`` (else None) for the Hg pass to reuse."""
    g = [torch.zeros_like(t) for t in leaves]
    kept = []
    for (xc, yc), k in zip(chunks, keep):
        grads = torch.autograd.grad(weighted(model(xc), yc), leaves, create_graph=k)
        add_(g, [gi.detach() for gi in grads])
        kept.append(grads if k else None)
    return g, kept


def batch_stats_only_(model: nn.Module) -> None:
    """Stop BatchNorm from tracking running statistics (on a private copy).

    In train mode BatchNorm normalises with batch statistics either way; only the
    in-place running-average update goes, which forward-mode AD cannot trace.
    """
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.track_running_stats = False
            m.running_mean = m.running_var = m.num_batches_tracked = None


def hvp_double(model, leaves, weighted, xc, yc, g, grads=None):
    """Hg reverse-over-reverse: ``∇(gᵀ∇L)`` through a ``create_graph`` backward.

    ``grads``: this chunk's ``create_graph`` gradient if already computed.
    """
    if grads is None:
        grads = torch.autograd.grad(weighted(model(xc), yc), leaves, create_graph=True)
    z = sum((gi * gg).sum() for gi, gg in zip(grads, g))
    return torch.autograd.grad(z, leaves)


def hvp_forward(model, names, leaves, weighted, xc, yc, g):
    """Hg forward-over-reverse: the derivative of ``∇L(θ + εg)`` at ε = 0."""
    from torch.func import functional_call, grad, jvp

    def f(theta):
        return weighted(functional_call(model, dict(zip(names, theta)), (xc,), strict=False), yc)

    _, tangent = jvp(grad(f), (tuple(t.detach() for t in leaves),), (tuple(g),))
    return tangent
