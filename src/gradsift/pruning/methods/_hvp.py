"""Gradients and Hessian-gradient products over chunks, for GraSP (private helpers).

``Hg`` is taken reverse-over-reverse (``∇(gᵀ∇L)`` through a ``create_graph``
backward, as the GraSP authors do) or forward-over-reverse (``torch.func.jvp`` of
``torch.func.grad``): the same values by an independent route.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import NamedTuple

import torch
from torch import nn

from gradsift.pruning.inputs import forward


class Chunk(NamedTuple):
    """Samples that go through the model together (and share BatchNorm statistics),
    and ``share``, the weight of their mean loss in the loss over the sample."""

    x: object
    y: torch.Tensor
    share: float


def add_(acc: list[torch.Tensor], parts) -> None:
    for a, p in zip(acc, parts):
        a += p


def math_attention():
    """A context in which ``scaled_dot_product_attention`` takes its math backend.

    The fused kernels (flash attention on CPU and CUDA) have no double backward and no
    forward-mode derivative; the math backend is plain differentiable operations.
    Outside attention nothing changes. On torch < 2.3 (no ``torch.nn.attention``) it
    does nothing.
    """
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:  # pragma: no cover - torch < 2.3
        return contextlib.nullcontext()
    return sdpa_kernel(SDPBackend.MATH)


def gradient(model, leaves, loss, chunks, keep):
    """``g = ∇L`` over all chunks; where ``keep[i]``, chunk i's gradient is taken with
    ``create_graph`` and returned in ``kept[i]`` (else None) for the Hg pass to reuse."""
    g = [torch.zeros_like(t) for t in leaves]
    kept = []
    for chunk, k in zip(chunks, keep):
        grads = torch.autograd.grad(loss(forward(model, chunk.x), chunk), leaves, create_graph=k)
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


def hvp_double(model, leaves, loss, chunk, g, grads=None):
    """Hg reverse-over-reverse: ``∇(gᵀ∇L)`` through a ``create_graph`` backward.

    ``grads``: this chunk's ``create_graph`` gradient if already computed.
    """
    if grads is None:
        grads = torch.autograd.grad(loss(forward(model, chunk.x), chunk), leaves, create_graph=True)
    z = sum((gi * gg).sum() for gi, gg in zip(grads, g))
    return torch.autograd.grad(z, leaves)


def hvp_forward(model, names, leaves, loss, chunk, g):
    """Hg forward-over-reverse: the derivative of ``∇L(θ + εg)`` at ε = 0."""
    from torch.func import functional_call, grad, jvp

    x = chunk.x
    args = () if isinstance(x, Mapping) else tuple(x) if isinstance(x, (tuple, list)) else (x,)
    kwargs = dict(x) if isinstance(x, Mapping) else None

    def f(theta):
        out = functional_call(model, dict(zip(names, theta)), args, kwargs, strict=False)
        return loss(out, chunk)

    _, tangent = jvp(grad(f), (tuple(t.detach() for t in leaves),), (tuple(g),))
    return tangent
