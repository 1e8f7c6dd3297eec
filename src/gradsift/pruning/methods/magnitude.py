"""Magnitude: ``|θ|`` of the effective weight, the classic baseline (Han et al.,
"Learning both Weights and Connections for Efficient Neural Networks", NeurIPS 2015,
arXiv:1506.02626), here applied at initialisation."""

from __future__ import annotations

from gradsift.pruning.params import effective
from gradsift.pruning.registry import register_method


def magnitude(model, targets, data=None):
    """``|θ|`` (a weight already pruned by ``torch.nn.utils.prune`` scores 0)."""
    return {name: effective(m, a).abs() for name, (m, a) in targets.items()}


# on a sharded model, ``|θ|`` of each rank's shard is that rank's part of the scores
register_method("magnitude", magnitude, reads_only=True, sharded=magnitude)
