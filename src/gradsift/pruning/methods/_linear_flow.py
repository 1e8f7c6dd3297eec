"""A linear layer of the linearised network that writes its own score in backward.

SynFlow's score of a ``Linear`` weight is ``|θ| ⊙ G`` with ``G = gᵀ x`` the weight's
gradient: ``g`` the output's gradient and ``x`` the layer's input, one row each on
SynFlow's single all-ones input, so ``G`` is the outer product ``g xᵀ``. Autograd
would materialise ``G`` (a weight-sized tensor, fresh memory each round) and then
multiply it in. ``ScoringLinear`` computes the input's gradient ``g φ`` first, then
multiplies ``φ`` in place by ``G`` a block of rows at a time (each entry the same
single product ``g_i x_j`` that the matrix product rounds once, so the scores are
bit for bit autograd's), and returns no weight gradient. With several input rows
(a sequence) it forms ``G`` with one matrix product, as autograd does. A bias that
is scored too (a zero parameter: it carries no flow) gets its gradient, the sum of
``g`` over rows, so that it is scored (0) and seen to reach the output.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

__all__ = ["ScoringLinear", "scoring_forward"]

_ROWS = 1 << 18  # entries per block of rows: 2 MiB of float64 stays in cache


class ScoringLinear(torch.autograd.Function):
    """``F.linear(x, φ, bias)``; backward writes ``φ^(1/power) ⊙ ∂R/∂φ`` over ``φ``
    (``power`` 1: SynFlow, 2: SynFlow-L2) and calls ``done()``."""

    @staticmethod
    def forward(ctx, x, phi, bias, power, done):
        ctx.save_for_backward(x, phi)
        ctx.power, ctx.done = power, done
        return F.linear(x, phi, bias)

    @staticmethod
    def backward(ctx, gy):
        x, phi = ctx.saved_tensors
        gx = gy.matmul(phi) if ctx.needs_input_grad[0] else None  # before φ is overwritten
        g2, x2 = gy.reshape(-1, phi.shape[0]), x.reshape(-1, phi.shape[1])
        gb = g2.sum(0) if ctx.needs_input_grad[2] else None
        with torch.no_grad():
            if g2.shape[0] == 1:
                g, xs = g2[0], x2[0]
                step = max(1, _ROWS // max(1, phi.shape[1]))
                for r in range(0, phi.shape[0], step):
                    rows = phi[r : r + step]
                    (rows.sqrt_() if ctx.power == 2 else rows).mul_(
                        torch.outer(g[r : r + step], xs)
                    )
            else:
                (phi.sqrt_() if ctx.power == 2 else phi).mul_(g2.t().mm(x2))
        ctx.done()
        return gx, None, gb, None, None


def scoring_forward(module: nn.Linear, power: int, done):
    """A ``forward`` for ``module`` (a plain ``nn.Linear`` whose weight is ``φ``); it
    holds the module weakly, so that the module and its forward form no cycle (which
    would keep ``φ`` alive until the garbage collector runs)."""
    ref = weakref.ref(module)

    def forward(input):  # nn.Linear.forward's name: callers may pass it by keyword
        m = ref()
        return ScoringLinear.apply(input, m.weight, m.bias, power, done)

    return forward
