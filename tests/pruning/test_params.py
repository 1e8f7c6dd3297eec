"""Which weights are scored, by name; copies of pruned models."""

import copy

import pytest
import torch

import gradsift
from gradsift.pruning.params import deepcopy_model, param_path, prunable
from pruning_support import batches, mlp


def test_default_selection_and_names():
    model = mlp()
    assert list(prunable(model)) == ["1.weight", "3.weight", "5.weight"]
    s = gradsift.score(model, "magnitude", params=lambda n, m, p: n.endswith("bias"))
    assert list(s) == ["1.bias", "3.bias", "5.bias"]
    assert list(gradsift.score(model, "magnitude", params=["3.weight"])) == ["3.weight"]
    with pytest.raises(ValueError, match="not found"):
        gradsift.score(model, "magnitude", params=["nope.weight"])
    with pytest.raises(ValueError, match="no parameters selected"):
        prunable(model, params=lambda n, m, p: False)


def test_pruned_names_stay_logical():
    model = mlp()
    gradsift.prune_at_init(model, "magnitude", 0.5)
    assert list(prunable(model)) == ["1.weight", "3.weight", "5.weight"]
    assert param_path(model, model[1], "weight") == "1.weight_orig"
    model(batches(1)[0][0]).sum().backward()  # leaves a non-leaf ``weight``
    twin = deepcopy_model(model)
    assert torch.equal(twin[1].weight_mask, model[1].weight_mask)


def test_scoring_keeps_model_identity():
    model = mlp()
    ref = copy.deepcopy(model)
    gradsift.score(model, "grasp", batches(4, n=6), samples_per_class=2)
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.equal(p, q)
