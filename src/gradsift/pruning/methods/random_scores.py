"""Random: uniform scores from a seeded generator, the baseline every method must beat
(Liu et al., "The Unreasonable Effectiveness of Random Pruning", ICLR 2022,
arXiv:2202.02643)."""

from __future__ import annotations

import torch

from gradsift.checks import check_int
from gradsift.pruning.params import original
from gradsift.pruning.registry import register_method
from gradsift.pruning.sharded_scoring import local_rows


def random_scores(model, targets, data=None, *, seed: int = 0):
    """Independent ``U(0, 1)`` scores from ``torch.Generator().manual_seed(seed)``."""
    gen = torch.Generator().manual_seed(check_int("seed", seed))
    weights = {name: original(m, a) for name, (m, a) in targets.items()}
    # drawn on the CPU in a fixed order: the same scores on every device
    return {
        name: torch.rand(w.shape, generator=gen, device="cpu").to(w.device)
        for name, w in weights.items()
    }


def random_sharded(model, targets, data=None, *, seed: int = 0):
    """``random_scores`` on a sharded model: the same scores, each rank keeping its rows.

    Every rank draws each full tensor from the same seeded generator, in the same
    order, and keeps its own rows, so the scores are the unsharded ones bit for bit.
    Cost: every rank generates all ``N`` numbers (time ``O(N)`` per rank, not
    ``O(N / world)``) and holds one full tensor at a time (the largest scored one),
    besides its local scores: CPU's generator cannot skip ahead to a rank's rows.
    """
    gen = torch.Generator().manual_seed(check_int("seed", seed))
    out = {}
    for name, (m, a) in targets.items():
        p = original(m, a)
        # drawn on the CPU (the generator's device); local_rows moves only the rows
        out[name] = local_rows(torch.rand(p.shape, generator=gen, device="cpu"), p)
    return out


register_method("random", random_scores, reads_only=True, sharded=random_sharded)
