"""SNIP: Lee, Ajanthan & Torr, "SNIP: Single-shot Network Pruning based on Connection
Sensitivity", ICLR 2019, arXiv:1810.02340.

Score ``|g ⊙ θ|`` with ``g = ∂L/∂θ`` the gradient of the loss summed over
``num_batches`` batches (the paper: one mini-batch). Scored in train mode, as the
model would train.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812

from gradsift.pruning.params import device_of, effective, leaves
from gradsift.pruning.registry import register_method
from gradsift.pruning.sampling import batches, need_data


def snip(model, targets, data=None, *, loss_fn=F.cross_entropy, num_batches: int | None = 1):
    """``|g ⊙ θ|``, ``g`` the loss gradient summed over ``num_batches`` batches."""
    need_data(data, "snip")
    model.train()
    ws = leaves(targets)
    grads = None
    for x, y in batches(data, device_of(model), num_batches):
        g = torch.autograd.grad(loss_fn(model(x), y), ws)
        grads = list(g) if grads is None else [a + b for a, b in zip(grads, g)]
    if grads is None:
        raise ValueError("data yielded no batches")
    return {name: (g * effective(m, a)).abs() for (name, (m, a)), g in zip(targets.items(), grads)}


register_method("snip", snip)
