"""Random scores: seeded, reproducible, independent of the global RNG."""

import torch

import gradsift
from pruning_support import mlp


def test_random_is_seeded():
    model = mlp()
    a = gradsift.score(model, "random", seed=1)
    torch.manual_seed(123)
    b = gradsift.score(model, "random", seed=1)
    c = gradsift.score(model, "random", seed=2)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["1.weight"], c["1.weight"])
    assert all(((s >= 0) & (s < 1)).all() for s in a.values())
