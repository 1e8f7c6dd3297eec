"""Straightforward transcriptions of what research code does, kept as baselines.

Used by the benchmarks (speed and memory) and by the tests (agreement). Not for
production use: they mutate ``.grad`` and assume Conv/Linear weights.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

__all__ = ["reference_grasp", "reference_grasp_batches", "reference_snip", "naive_topk_step"]


def _copy_and_weights(model: nn.Module):
    """A copy of ``model`` (its train/eval mode kept) and its Conv2d/Linear weights."""
    net = copy.deepcopy(model)
    net.zero_grad()
    names = [n + ".weight" for n, m in net.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    weights = [net.get_parameter(n) for n in names]
    for w in weights:
        w.requires_grad_(True)
    return net, names, weights


def _hessian_gradient(net, weights, batches, temperature):
    """The authors' loop: ``g`` = the sum of the batches' mean-loss gradients, then per
    batch a ``create_graph`` pass, ``z = gᵀ∇L_b``, ``z.backward()`` accumulating Hg
    in ``.grad``."""
    grad_w = None
    for xs, ys in batches:
        loss = F.cross_entropy(net(xs) / temperature, ys)
        g = torch.autograd.grad(loss, weights)
        grad_w = list(g) if grad_w is None else [a + b for a, b in zip(grad_w, g)]
    for xs, ys in batches:
        loss = F.cross_entropy(net(xs) / temperature, ys)
        grad_f = torch.autograd.grad(loss, weights, create_graph=True)
        z = sum((gw * gf).sum() for gw, gf in zip(grad_w, grad_f))
        z.backward()
    return [w.grad for w in weights]


def reference_grasp(model: nn.Module, x: torch.Tensor, y: torch.Tensor, temperature=200.0):
    """GraSP as in the authors' code (Wang et al. 2020, arXiv:2002.07376; the GraSP
    repository's ``GraSP()``).

    Two half-batches (the first ``N // 2`` samples and the rest, each normalised by
    BatchNorm on its own in train mode): first-order gradients of each half summed
    into ``g``; then per half a ``create_graph`` pass, ``z = gᵀ∇L``, ``z.backward()``
    accumulating ``Hg``. Returns the paper's ``-θ ⊙ Hg`` (removed-highest) keyed by
    parameter name. Its ``g`` and ``Hg`` are sums of two half-batch means: for equal
    halves 4x gradsift's, the same ranking.
    """
    net, names, weights = _copy_and_weights(model)
    n = x.shape[0]
    halves = [(x[: n // 2], y[: n // 2]), (x[n // 2 :], y[n // 2 :])]
    hg = _hessian_gradient(net, weights, halves, temperature)
    return {name: -w.detach() * h for name, w, h in zip(names, weights, hg)}


def reference_grasp_batches(model: nn.Module, batches, temperature=200.0):
    """GraSP as the Synaptic-Flow repository runs it (Tanaka et al. 2020,
    arXiv:2006.05467, ``Pruners/pruners.py``): the same loop over the batches of its
    pruning loader instead of two halves of a class-balanced sample, each batch's
    mean loss counted alike, and the score ``θ ⊙ Hg`` kept highest. (It divides the
    scores by ``|Σ scores|``, which changes no ranking and is left out.) In the mode
    the model is in: the repository scores in eval mode unless told otherwise.
    """
    net, names, weights = _copy_and_weights(model)
    hg = _hessian_gradient(net, weights, batches, temperature)
    return {name: w.detach() * h for name, w, h in zip(names, weights, hg)}


def reference_snip(model: nn.Module, batches):
    """SNIP (Lee et al. 2019, arXiv:1810.02340): ``|θ ⊙ g|`` with ``g`` the sum of
    the batches' mean-loss gradients (the derivative with respect to a mask of ones).
    One batch is the SNIP paper's; every batch of the pruning loader the
    Synaptic-Flow repository's (which divides by the scores' sum, left out here). In
    the mode the model is in.
    """
    net, names, weights = _copy_and_weights(model)
    grads = None
    for xs, ys in batches:
        g = torch.autograd.grad(F.cross_entropy(net(xs), ys), weights)
        grads = list(g) if grads is None else [a + b for a, b in zip(grads, g)]
    return {name: (w.detach() * g).abs() for name, w, g in zip(names, weights, grads)}


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
