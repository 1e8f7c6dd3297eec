"""Magnitude: ``|θ|`` of the effective weight, the classic baseline (Han et al.,
"Learning both Weights and Connections for Efficient Neural Networks", NeurIPS 2015,
arXiv:1506.02626), here applied at initialisation."""

from __future__ import annotations

import torch

from gradsift.pruning.flat import flat_like
from gradsift.pruning.params import mask_of, original
from gradsift.pruning.registry import register_method


def magnitude(model, targets, data=None):
    """``|θ|`` (a weight already pruned by ``torch.nn.utils.prune`` scores 0).

    The scores lie in one flat buffer (at least float32, exact for every float
    dtype), which the selection ranks where it lies: one copy of the weights in all.
    """
    weights = [original(m, a) for m, a in targets.values()]
    if len({w.device for w in weights}) > 1:  # spread over devices: one buffer each
        return {n: _abs_into(w.abs(), m, a) for n, w, (m, a) in _rows(targets, weights)}
    dtype = torch.float32
    for w in weights:
        dtype = torch.promote_types(dtype, w.dtype)
    views = flat_like(weights, dtype=dtype)
    return {
        name: _abs_into(torch.abs(w, out=view), m, a)
        for (name, w, (m, a)), view in zip(_rows(targets, weights), views)
    }


def _rows(targets: dict, weights: list):
    return [(name, w, ma) for (name, ma), w in zip(targets.items(), weights)]


def _abs_into(scores: torch.Tensor, module, attr: str) -> torch.Tensor:
    mask = mask_of(module, attr)
    return scores if mask is None else scores.mul_(mask)


register_method("magnitude", magnitude, reads_only=True)
