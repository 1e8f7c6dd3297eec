"""prune_at_init: rounds, monotone masks, shuffling."""

import torch

import gradsift
from gradsift import masks_from_scores, prune_at_init, shuffle_masks, sparsity_report
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
