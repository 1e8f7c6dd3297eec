"""Random: uniform scores from a seeded generator, the baseline every method must beat
(Liu et al., "The Unreasonable Effectiveness of Random Pruning", ICLR 2022,
arXiv:2202.02643)."""

from __future__ import annotations

import torch

from gradsift.pruning.params import original
from gradsift.pruning.registry import register_method


def random_scores(model, targets, data=None, *, seed: int = 0):
    """Independent ``U(0, 1)`` scores from ``torch.Generator().manual_seed(seed)``."""
    gen = torch.Generator().manual_seed(seed)
    return {
        name: torch.rand(original(m, a).shape, generator=gen).to(original(m, a).device)
        for name, (m, a) in targets.items()
    }


register_method("random", random_scores, reads_only=True)
