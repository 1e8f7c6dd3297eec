"""Sanity-check variants: exact totals, per-layer counts where the variant is
layer-wise, and each doing what it says (Frankle et al. 2021; Su et al. 2020)."""

import pytest
import torch

import gradsift
from gradsift import masks_from_scores, prune_at_init
from gradsift.pruning import SANITY, layer_counts
from gradsift.pruning.sanity import shuffle_global
from pruning_support import convnet, convnet_data

SPARSITY = 0.8


def counts(masks):
    return {n: int(m.sum()) for n, m in masks.items()}


def plain_masks(method, budget):
    return prune_at_init(convnet(), method, SPARSITY, convnet_data(), allocation=budget)


@pytest.mark.parametrize("budget", ["global", "uniform", "erk"])
@pytest.mark.parametrize("sanity", SANITY)
def test_sanity_keeps_the_budget_exact(sanity, budget):
    model = convnet()
    gen = torch.Generator().manual_seed(5)
    masks = prune_at_init(
        model, "snip", SPARSITY, convnet_data(), allocation=budget, sanity=sanity, generator=gen
    )
    total = sum(m.numel() for m in masks.values())
    assert sum(counts(masks).values()) == total - round(SPARSITY * total)
    for n, m in masks.items():  # what is installed is what was returned
        assert torch.equal(model.get_buffer(n + "_mask"), m)
    plain = plain_masks("snip", budget)
    if sanity in ("shuffle-layer", "reinit"):  # layer-wise: the method's own counts
        assert counts(masks) == counts(plain)
    if sanity == "invert" and budget != "global":  # the budget's counts
        assert counts(masks) == layer_counts({n: m.shape for n, m in masks.items()}, 0.8, budget)
    if sanity != "reinit":
        assert any(not torch.equal(masks[n], plain[n]) for n in masks)


def test_invert_keeps_the_lowest_scores():
    model = convnet()
    masks = prune_at_init(model, "magnitude", SPARSITY, allocation="uniform", sanity="invert")
    scores = gradsift.score(convnet(), "magnitude")
    expected = masks_from_scores({n: -s for n, s in scores.items()}, SPARSITY, allocation="uniform")
    for n in masks:
        assert torch.equal(masks[n], expected[n])
        kept, pruned = scores[n][masks[n] > 0], scores[n][masks[n] == 0]
        assert kept.max() <= pruned.min()


def test_invert_is_applied_every_round_and_stays_monotone():
    masks = prune_at_init(
        convnet(), "synflow", 0.9, convnet_data(), iterations=3, allocation="erk", sanity="invert"
    )
    shapes = {n: m.shape for n, m in masks.items()}
    assert counts(masks) == layer_counts(shapes, 0.9, "erk")


def test_reinit_keeps_masks_and_permutes_weights_within_each_layer():
    gen = torch.Generator().manual_seed(1)
    before = convnet()
    model = convnet()
    masks = prune_at_init(model, "magnitude", SPARSITY, sanity="reinit", generator=gen)
    plain = prune_at_init(convnet(), "magnitude", SPARSITY)
    for n in masks:
        assert torch.equal(masks[n], plain[n])
        old = before.get_parameter(n).detach()
        new = model.get_parameter(n + "_orig").detach()
        assert torch.equal(torch.sort(old.reshape(-1)).values, torch.sort(new.reshape(-1)).values)
        assert not torch.equal(old, new)
        torch.testing.assert_close(model.get_submodule(n.rsplit(".", 1)[0]).weight, new * masks[n])
    # biases and BatchNorm are not touched
    assert torch.equal(before[0].bias, model[0].bias)
    assert torch.equal(before[1].weight, model[1].weight)


def test_shuffle_global_keeps_only_the_total():
    masks = plain_masks("synflow", "global")
    out = shuffle_global(masks, generator=torch.Generator().manual_seed(0))
    assert sum(counts(out).values()) == sum(counts(masks).values())
    assert counts(out) != counts(masks)  # a global permutation moves weights across layers
    assert all(out[n].shape == masks[n].shape for n in masks)


def test_shuffle_flag_is_shuffle_layer():
    a = prune_at_init(convnet(), "snip", 0.8, convnet_data(), shuffle=True)
    b = prune_at_init(convnet(), "snip", 0.8, convnet_data(), sanity="shuffle-layer")
    assert all(torch.equal(a[n], b[n]) for n in a)
    with pytest.raises(ValueError, match="shuffle=True is sanity"):
        prune_at_init(convnet(), "snip", 0.8, convnet_data(), shuffle=True, sanity="invert")


def test_bad_sanity_lists_the_valid_ones():
    with pytest.raises(ValueError, match=r"sanity must be one of \['reinit', 'invert', 'shuffle"):
        prune_at_init(convnet(), "magnitude", 0.5, sanity="shuffle")
