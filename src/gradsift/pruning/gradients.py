"""Gradients of the scored weights accumulated in one flat buffer.

``grad_buffers`` presets each scored weight's ``.grad`` to a zeroed view of one flat
buffer (``gradsift.pruning.flat``); ``backward`` then adds every batch's gradient into
it in place (autograd's accumulation with ``inputs=``), so a criterion that turns
gradients into scores in place (SNIP's ``|g ⊙ θ|``) hands the selection one buffer to
rank where it lies: one copy of the weights for gradients and scores together,
instead of per-batch gradients, their sum and a flat copy of the scores.

A weight the loss does not reach keeps a zero gradient.
"""

from __future__ import annotations

import torch

from gradsift.pruning.flat import flat_like
from gradsift.pruning.params import leaves

__all__ = ["accumulate_", "grad_buffers", "release_"]


def grad_buffers(targets: dict) -> list[torch.Tensor]:
    """The weights behind ``targets`` (switched to ``requires_grad``), each with a
    zeroed ``.grad`` of its dtype; one flat buffer when they share dtype and device
    (autograd wants a gradient of its weight's dtype), else one each."""
    ws = leaves(targets)
    one = len({(w.dtype, w.device) for w in ws}) == 1
    for w, g in zip(ws, flat_like(ws) if one else [torch.empty_like(w) for w in ws]):
        w.grad = g.zero_()
    return ws


def accumulate_(loss: torch.Tensor, ws: list[torch.Tensor], weight: float = 1.0) -> None:
    """``w.grad += weight * ∂loss/∂w`` for every ``w`` in ``ws``, in place."""
    handles = []
    if weight != 1.0:
        handles = [w.register_hook(lambda g, s=weight: g * s) for w in ws]
    try:
        loss.backward(inputs=ws)
    finally:
        for h in handles:
            h.remove()


def release_(ws: list[torch.Tensor]) -> None:
    """Detach the buffers from the weights (the caller keeps what it returned)."""
    for w in ws:
        w.grad = None
        w.requires_grad_(False)
