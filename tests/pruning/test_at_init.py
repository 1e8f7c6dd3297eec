"""prune_at_init: rounds, schedules, monotone masks, shuffling."""

import pytest
import torch

import gradsift
from gradsift import masks_from_scores, prune_at_init, shuffle_masks, sparsity_report
from gradsift.pruning import BUDGETS, layer_counts
from gradsift.pruning.at_init import round_sparsities
from pruning_support import convnet, convnet_data


def test_iterative_synflow_exact_and_monotone():
    model = convnet()
    seen = []
    real = gradsift.pruning.at_init.masks_from_scores

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        seen.append({k: v.clone() for k, v in out.items()})
        return out

    gradsift.pruning.at_init.masks_from_scores = spy
    try:
        masks = prune_at_init(model, "synflow", 0.95, convnet_data(), iterations=10)
    finally:
        gradsift.pruning.at_init.masks_from_scores = real
    assert len(seen) == 10
    for before, after in zip(seen, seen[1:]):
        for k in before:
            assert (after[k] <= before[k]).all()
    total = sum(m.numel() for m in masks.values())
    assert sum(int(m.sum()) for m in masks.values()) == total - round(0.95 * total)
    assert not sparsity_report(model).collapsed


def test_round_sparsities():
    s = round_sparsities(0.99, 4, "exponential")
    torch.testing.assert_close(
        torch.tensor(s, dtype=torch.float64),
        1 - torch.tensor([0.01 ** (i / 4) for i in range(1, 5)], dtype=torch.float64),
    )
    assert round_sparsities(0.5, 2, "linear") == [0.25, 0.5]
    with pytest.raises(ValueError, match="schedule"):
        round_sparsities(0.5, 2, "cosine")
    with pytest.raises(ValueError, match="iterations"):
        round_sparsities(0.5, 0, "linear")


def test_shuffle_keeps_layer_density():
    model = convnet()
    masks = prune_at_init(
        model, "magnitude", 0.9, shuffle=True, generator=torch.Generator().manual_seed(3)
    )
    plain = masks_from_scores(gradsift.score(convnet(), "magnitude"), 0.9)
    for k in masks:
        assert int(masks[k].sum()) == int(plain[k].sum())
        assert torch.equal(model.get_buffer(k + "_mask"), masks[k])
    assert any(not torch.equal(masks[k], plain[k]) for k in masks)
    again = shuffle_masks(plain, generator=torch.Generator().manual_seed(3))
    assert all(int(again[k].sum()) == int(plain[k].sum()) for k in plain)


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("method", gradsift.list_methods())
def test_every_method_is_exact_under_every_budget(method, budget):
    model = convnet()
    masks = prune_at_init(model, method, 0.85, convnet_data(), budget=budget)
    total = sum(m.numel() for m in masks.values())
    assert sum(int(m.sum()) for m in masks.values()) == total - round(0.85 * total)
    if budget != "global":
        shapes = {n: m.shape for n, m in masks.items()}
        assert {n: int(m.sum()) for n, m in masks.items()} == layer_counts(shapes, 0.85, budget)
    report = sparsity_report(model)
    assert report.kept == total - round(0.85 * total)


def test_iterative_rounds_under_erk_end_on_erk_counts():
    model = convnet()
    masks = prune_at_init(model, "synflow", 0.95, convnet_data(), iterations=4, budget="erk")
    shapes = {n: m.shape for n, m in masks.items()}
    assert {n: int(m.sum()) for n, m in masks.items()} == layer_counts(shapes, 0.95, "erk")


def test_bad_budget_names_the_valid_ones():
    with pytest.raises(ValueError, match=r"budget must be one of \['global', 'uniform', 'er'"):
        prune_at_init(convnet(), "magnitude", 0.5, budget="ERK")
