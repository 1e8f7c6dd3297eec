"""FORCE against a float64 transcription of de Jorge et al.'s Algorithm 1."""

import pytest
import torch

import gradsift
from progressive_support import reference_skeleton
from pruning_support import NAMES, batches, mlp


@pytest.mark.parametrize("decay", ["exponential", "linear"])
def test_force_masks_match_the_reference_and_revive_weights(decay):
    model, data = mlp(), batches(2)
    history = reference_skeleton(model, data[0], 0.9, 6, revive=True, decay=decay)
    masks = gradsift.prune_at_init(model, "force", 0.9, data, steps=6, decay=decay)
    for n, expected in zip(NAMES, history[-1]):
        assert torch.equal(masks[n], expected.float()), n
    # the reference's own trajectory brings pruned weights back: the test can tell
    # FORCE from Iterative SNIP
    revived = sum(
        int(((a == 0) & (b > 0)).sum())
        for before, after in zip(history, history[1:])
        for a, b in zip(before, after)
    )
    assert revived > 0


def test_force_scores_are_the_last_rounds_saliency():
    model, data = mlp(), batches(2)
    scores = gradsift.score(model, "force", data, sparsity=0.8, steps=4)
    expected = reference_skeleton(model, data[0], 0.8, 4, revive=True)[-1]
    masks = gradsift.masks_from_scores(scores, 0.8)
    assert all(torch.equal(masks[n], e.float()) for n, e in zip(NAMES, expected))
    assert all((s >= 0).all() for s in scores.values())


@pytest.mark.parametrize("method", ["force", "iter_snip"])
def test_one_step_is_snip(method):
    model, data = mlp(), batches(2)
    got = gradsift.score(model, method, data, steps=1)
    snip = gradsift.score(model, "snip", data)
    for n in NAMES:
        torch.testing.assert_close(got[n], snip[n], rtol=1e-12, atol=0)


def test_bad_options():
    with pytest.raises(ValueError, match="decay must be one of"):
        gradsift.score(mlp(), "force", batches(1), decay="cosine")
    with pytest.raises(ValueError, match="steps must be >= 1"):
        gradsift.score(mlp(), "force", batches(1), steps=0)
    with pytest.raises(ValueError, match="needs data"):
        gradsift.score(mlp(), "force")
