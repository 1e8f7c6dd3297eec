"""SNIP against an autograd reference of |g ⊙ θ|."""

import torch
from torch import nn

import gradsift
from pruning_support import NAMES, batches, flat_loss, mlp, unflatten


def test_snip_against_autograd_reference():
    model = mlp()
    data = batches(1)
    f, w = flat_loss(model, NAMES, data)
    g = torch.autograd.grad(f(w.requires_grad_()), w)[0]
    expected = unflatten((g * w.detach()).abs(), model, NAMES)
    got = gradsift.score(model, "snip", data)
    for n in NAMES:
        torch.testing.assert_close(got[n], expected[n], rtol=1e-12, atol=1e-15)


def test_snip_num_batches_sums_gradients():
    model = mlp()
    data = batches(3)
    g = [
        torch.autograd.grad(
            nn.functional.cross_entropy(model(x), y), [model.get_parameter(n) for n in NAMES]
        )
        for x, y in data[:2]
    ]
    got = gradsift.score(model, "snip", data, num_batches=2)
    for i, n in enumerate(NAMES):
        expected = ((g[0][i] + g[1][i]) * model.get_parameter(n)).abs()
        torch.testing.assert_close(got[n], expected.detach(), rtol=1e-12, atol=1e-15)
