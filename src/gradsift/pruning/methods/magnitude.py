"""Magnitude: ``|θ|`` of the effective weight, the classic baseline (Han et al.,
"Learning both Weights and Connections for Efficient Neural Networks", NeurIPS 2015,
arXiv:1506.02626), here applied at initialisation."""

from __future__ import annotations

import functools

import torch

from gradsift.pruning.boolean_mask import as_bool
from gradsift.pruning.flat import flat_like
from gradsift.pruning.keep_where import keep_where_
from gradsift.pruning.params import effective, mask_of, original
from gradsift.pruning.registry import register_method


def magnitude(model, targets, data=None):
    """``|θ|`` (a weight already pruned by ``torch.nn.utils.prune`` scores 0).

    The scores lie in one flat buffer (at least float32, exact for every float
    dtype), which the selection ranks where it lies: one copy of the weights in all.
    """
    weights = [original(m, a) for m, a in targets.values()]
    if len({w.device for w in weights}) > 1:  # spread over devices: a tensor each
        views = [
            torch.empty_like(w, dtype=torch.promote_types(w.dtype, torch.float32)) for w in weights
        ]
    else:
        dtype = functools.reduce(torch.promote_types, [w.dtype for w in weights], torch.float32)
        views = flat_like(weights, dtype=dtype)
    for view, w, (m, a) in zip(views, weights, targets.values()):
        if view.dtype == w.dtype:
            torch.abs(w.detach(), out=view)
        else:  # bfloat16 or float16 weights: their |θ| in float32, exactly
            view.copy_(w).abs_()
        if mask_of(m, a) is not None:  # pruned: 0, whatever weight_orig holds there
            keep_where_(view, as_bool(mask_of(m, a)))
    return dict(zip(targets, views))


def magnitude_sharded(model, targets, data=None):
    """``magnitude`` on a sharded model: ``|θ|`` of each rank's shard is that rank's
    part of the scores (``DTensor`` s like the weights)."""
    return {name: effective(m, a).abs() for name, (m, a) in targets.items()}


register_method("magnitude", magnitude, reads_only=True, sharded=magnitude_sharded)
