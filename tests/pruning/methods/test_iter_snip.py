"""Iterative SNIP against a float64 transcription of de Jorge et al.'s Algorithm 1."""

import pytest
import torch

import gradsift
from progressive_support import reference_skeleton
from pruning_support import NAMES, batches, mlp


# at 20 steps some survivors lose their whole gradient and tie with the pruned at 0:
# there the pruned must stay out (a looser rule revives lower-indexed pruned weights)
@pytest.mark.parametrize("steps", [6, 20])
def test_iter_snip_masks_match_the_reference_and_only_shrink(steps):
    model, data = mlp(), batches(2)
    history = reference_skeleton(model, data[0], 0.9, steps, revive=False)
    for before, after in zip(history, history[1:]):
        assert all((b <= a).all() for a, b in zip(before, after))
    masks = gradsift.prune_at_init(model, "iter_snip", 0.9, data, steps=steps)
    for n, expected in zip(NAMES, history[-1]):
        assert torch.equal(masks[n], expected.float()), n


def test_earlier_pruned_weights_score_lower():
    model, data = mlp(), batches(2)
    history = reference_skeleton(model, data[0], 0.9, 4, revive=False)
    scores = gradsift.score(model, "iter_snip", data, sparsity=0.9, steps=4)
    for i, n in enumerate(NAMES):
        alive = history[-2][i] > 0  # survivors of round T - 1 keep their saliency
        assert (scores[n][alive] >= 0).all()
        for r in range(3):  # pruned in round r + 1 of 4 scores r + 1 - 4
            was = torch.ones_like(alive) if r == 0 else history[r - 1][i] > 0
            pruned_now = was & (history[r][i] == 0)
            assert (scores[n][pruned_now] == r + 1 - 4).all()
    # so every looser sparsity along the way gives the reference's masks of that round
    kept = sum(int(m.sum()) for m in history[1])
    total = sum(m.numel() for m in history[1])
    masks = gradsift.masks_from_scores(scores, (total - kept) / total)
    assert all(torch.equal(masks[n], history[1][i].float()) for i, n in enumerate(NAMES))


# one step is SNIP: tests/pruning/methods/test_force.py checks both methods
