"""Gradients of the scored weights accumulated in one flat buffer.

``GradBuffers(targets)`` presets each scored weight's ``.grad`` to a zeroed view of
one flat buffer (``gradsift.pruning.flat``); ``accumulate_`` then adds every batch's
gradient into it in place (autograd's accumulation with ``inputs=``), so a criterion
that turns gradients into scores in place (SNIP's ``|g ⊙ θ|``) hands the selection one
buffer to rank where it lies: one copy of the weights for gradients and scores
together, instead of per-batch gradients, their sum and a flat copy of the scores.

Autograd computes each weight's gradient as a new weight-sized tensor and then adds it
to ``.grad``: for a moment the largest layer's weights are held once more. A plain
``nn.Linear`` whose weight is scored (and not pruned) runs ``AccumulatingLinear``
instead, whose backward adds ``α gᵀ x`` (``g`` the output's gradient, ``x`` the input,
rows flattened) into the weight's ``.grad`` with one ``addmm_`` and hands autograd no
weight gradient. Into a zeroed buffer that is the product autograd computes, bit for
bit; a later batch's sum is rounded once instead of twice. Under ``torch.autocast``
the layer runs ``F.linear`` and autograd's own backward (its weight gradient is the
low-precision product, cast back). The weight is held by the function, not saved
for backward, so activation checkpointing (``use_reentrant=False``) recomputes the
input only.

A weight the loss does not reach keeps a zero gradient.
"""

from __future__ import annotations

import functools
import weakref

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from gradsift.pruning.flat import flat_like
from gradsift.pruning.params import is_plain_linear, leaves, mask_of

__all__ = ["AccumulatingLinear", "GradBuffers"]


class AccumulatingLinear(torch.autograd.Function):
    """``F.linear(x, weight, bias)``; backward adds ``scale[0] · gᵀ x`` into
    ``weight.grad`` in place and returns no gradient for ``weight``."""

    @staticmethod
    def forward(ctx, x, weight, bias, scale):
        ctx.save_for_backward(x)
        # the parameter itself: a checkpointed region's recomputation would hand back
        # a saved weight that is another tensor, without the preset ``.grad``
        ctx.weight, ctx.scale = weight, scale
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, gy):
        (x,), weight = ctx.saved_tensors, ctx.weight
        gx = gy.matmul(weight) if ctx.needs_input_grad[0] else None
        g2 = gy.reshape(-1, weight.shape[0])
        gb = g2.sum(0) if ctx.needs_input_grad[2] else None
        with torch.no_grad():
            weight.grad.addmm_(g2.t(), x.reshape(-1, weight.shape[1]), alpha=ctx.scale[0])
        return gx, None, gb, None


class GradBuffers:
    """The scored weights (``weights``: switched to ``requires_grad``), each with a
    zeroed ``.grad`` of its dtype: one flat buffer when they share dtype and device
    (autograd wants a gradient of its weight's dtype), else one each."""

    def __init__(self, targets: dict):
        self.weights = ws = leaves(targets)
        one = len({(w.dtype, w.device) for w in ws}) == 1
        for w, g in zip(ws, flat_like(ws) if one else [torch.empty_like(w) for w in ws]):
            w.grad = g.zero_()
        self._scale = [1.0]
        self._patched = []
        for module, attr in targets.values():
            if is_plain_linear(module) and attr == "weight" and mask_of(module, attr) is None:
                module.forward = _accumulating_forward(module, self._scale)
                self._patched.append(module)

    def accumulate_(self, loss: torch.Tensor, weight: float = 1.0) -> None:
        """``w.grad += weight * ∂loss/∂w`` for every scored ``w``, in place."""
        self._scale[0] = weight
        handles = []
        if weight != 1.0:
            handles = [w.register_hook(functools.partial(_scaled, s=weight)) for w in self.weights]
        try:
            loss.backward(inputs=self.weights)
        finally:
            for h in handles:
                h.remove()

    def release_(self) -> list[torch.Tensor]:
        """The gradients, detached from the weights; the layers' own forwards back."""
        grads = [w.grad for w in self.weights]
        for w in self.weights:
            w.grad = None
            w.requires_grad_(False)
        for module in self._patched:
            del module.forward
        self._patched = []
        return grads


def _scaled(g, s: float):
    """A weight's autograd gradient scaled (none from an ``AccumulatingLinear``)."""
    return None if g is None else g * s


def _accumulating_forward(module: nn.Linear, scale: list):
    """A ``forward`` for ``module`` holding it weakly (no module-forward cycle)."""
    ref = weakref.ref(module)

    def forward(input):  # nn.Linear.forward's name: callers may pass it by keyword
        m = ref()
        if _autocasting(input.device.type):  # autograd's backward casts the product
            return F.linear(input, m.weight, m.bias)
        return AccumulatingLinear.apply(input, m.weight, m.bias, scale)

    return forward


def _autocasting(device_type: str) -> bool:
    """Whether ``torch.autocast`` is on for ``device_type`` (torch 2.2-2.3 too)."""
    try:
        return torch.is_autocast_enabled(device_type)
    except TypeError:  # before torch 2.4: no device argument
        if device_type == "cpu":
            return torch.is_autocast_cpu_enabled()
        return device_type == "cuda" and torch.is_autocast_enabled()
