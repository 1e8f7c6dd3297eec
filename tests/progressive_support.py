"""Float64 transcriptions of the papers' algorithms on ``pruning_support.mlp()``, written
from the equations with a hand-written forward pass: the references the new criteria
are tested against (importable: tests/ is on the path)."""

import torch
from torch.nn import functional as F

from pruning_support import NAMES


def mlp_tensors(model):
    """The weights and biases of ``mlp()`` as plain float64 tensors, in layer order."""
    ws = [model.get_parameter(n).detach().clone() for n in NAMES]
    bs = [model.get_parameter(n.replace("weight", "bias")).detach().clone() for n in NAMES]
    return ws, bs


def mlp_forward(ws, bs, x, norm=None):
    """Flatten, then Linear-ReLU, Linear-ReLU, Linear; ``norm(i, h)`` after layer i."""
    h = x.flatten(1)
    for i, (w, b) in enumerate(zip(ws, bs)):
        h = h @ w.T + b
        if norm is not None:
            h = norm(i, h)
        if i < len(ws) - 1:
            h = torch.relu(h)
    return h


def top_k_mask(scores, k):
    """Keep the k largest of the concatenated scores, ties to the lower index."""
    flat = torch.cat([s.reshape(-1) for s in scores])
    keep = torch.zeros_like(flat)
    keep[torch.argsort(-flat, stable=True)[:k]] = 1.0
    out, at = [], 0
    for s in scores:
        out.append(keep[at : at + s.numel()].view_as(s))
        at += s.numel()
    return out


def reference_skeleton(model, batch, sparsity, steps, *, revive, decay="exponential"):
    """de Jorge et al. 2021, Algorithm 1: FORCE (``revive``) or Iterative SNIP; every
    round's gradient on ``batch``. Returns the mask after every round."""
    theta, bs = mlp_tensors(model)
    n = sum(t.numel() for t in theta)
    masks, history = [torch.ones_like(t) for t in theta], []
    for t in range(1, steps + 1):
        if decay == "exponential":
            density = (1 - sparsity) ** (t / steps)
        else:
            density = 1 - sparsity * t / steps
        kept = n - round(sparsity * n) if t == steps else n - round((1 - density) * n)
        w = [(th * m).requires_grad_(True) for th, m in zip(theta, masks)]
        loss = F.cross_entropy(mlp_forward(w, bs, batch[0]), batch[1])
        g = torch.autograd.grad(loss, w)
        if revive:
            saliency = [(th * gi).abs() for th, gi in zip(theta, g)]
        else:  # the dead are out of the race
            saliency = [
                torch.where(m > 0, (wi * gi).abs(), -torch.inf).detach()
                for wi, gi, m in zip(w, g, masks)
            ]
        masks = top_k_mask(saliency, kept)
        history.append(masks)
    return history
