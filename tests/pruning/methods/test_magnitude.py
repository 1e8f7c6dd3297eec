"""Magnitude: |θ| of the effective weight."""

import torch

import gradsift
from pruning_support import mlp


def test_magnitude_is_abs_weight_and_zero_where_pruned():
    model = mlp()
    scores = gradsift.score(model, "magnitude")
    torch.testing.assert_close(scores["1.weight"], model[1].weight.abs(), rtol=0, atol=0)
    gradsift.prune_at_init(model, "magnitude", 0.5)
    scores = gradsift.score(model, "magnitude")
    for name, s in scores.items():
        assert (s[model.get_buffer(name + "_mask") == 0] == 0).all()
