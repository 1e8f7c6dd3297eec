"""SynFlow-L2 against an autograd closed form and its conservation law with BatchNorm."""

import pytest
import torch
from torch import nn

import gradsift
from gradsift.lab.models import VGG
from pruning_support import NAMES, mlp


@pytest.mark.parametrize("bias", [False, True])
def test_synflow_l2_is_half_the_gradient_of_the_squared_path_norm(bias):
    model = mlp(bias=bias)
    theta = [model.get_parameter(n).detach().clone().requires_grad_(True) for n in NAMES]
    v = torch.ones(12, dtype=torch.float64)
    for w in theta:  # R₂ = 1ᵀ (W₃⊙W₃)(W₂⊙W₂)(W₁⊙W₁) 1, biases carry no flow
        v = (w * w) @ v
    grads = torch.autograd.grad(v.sum(), theta)
    got = gradsift.score(model, "synflow_l2", input_shape=(12,))
    for n, g in zip(NAMES, grads):
        torch.testing.assert_close(got[n], 0.5 * g.abs(), rtol=1e-12, atol=0)


def test_synflow_l2_conservation_with_batchnorm_vgg():
    # Σ_layer φ ⊙ ∂R₂/∂φ = R₂ for every layer when BatchNorm's scale is squared too
    torch.manual_seed(0)
    model = VGG(11, input_shape=(3, 8, 8), num_classes=10, batch_norm=True)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_var.uniform_(0.5, 2.0)
                m.running_mean.uniform_(-1, 1)
                m.weight.uniform_(0.5, 1.5)
    scores = gradsift.score(model, "synflow_l2", input_shape=(3, 8, 8))
    sums = torch.stack(
        [(s * model.get_parameter(n).detach().double().abs()).sum() for n, s in scores.items()]
    )
    torch.testing.assert_close(sums, sums[0].expand_as(sums), rtol=1e-9, atol=0)


def test_batchnorm_scale_is_squared_like_every_linear_map():
    torch.manual_seed(1)
    model = nn.Sequential(
        nn.Flatten(), nn.Linear(12, 10), nn.BatchNorm1d(10), nn.ReLU(), nn.Linear(10, 3)
    ).double()
    bn = model[2]
    with torch.no_grad():
        bn.running_var.uniform_(0.1, 3.0)
        bn.running_mean.uniform_(-1, 1)
        bn.weight.uniform_(-1.5, 1.5)
    w1, w2 = (model[i].weight.detach() for i in (1, 4))
    phi = [(w1 * w1).requires_grad_(True), (w2 * w2).requires_grad_(True)]
    scale = bn.weight.detach() ** 2 / (bn.running_var + bn.eps)  # (γ/√(var+ε))²
    r = (phi[1] @ (scale * (phi[0] @ torch.ones(12, dtype=torch.float64)))).sum()
    grads = torch.autograd.grad(r, phi)
    got = gradsift.score(model, "synflow_l2", input_shape=(12,))
    torch.testing.assert_close(got["1.weight"], w1.abs() * grads[0], rtol=1e-10, atol=0)
    torch.testing.assert_close(got["4.weight"], w2.abs() * grads[1], rtol=1e-10, atol=0)


# the rescorer: tests/pruning/methods/test_synflow.py checks SynFlow and SynFlow-L2 alike
