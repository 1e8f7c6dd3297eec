"""NTK-SAP against a float64 transcription of Wang et al.'s perturbation score, with the
mask as the variable (|∂J/∂m| ⊙ [m ≠ 0]), drawing from one seeded generator in the
documented order: each weight's fresh θ, then x, then each weight's δ."""

import math

import pytest
import torch
from torch import nn

import gradsift
from gradsift.pruning.methods.ntk_sap import ntk_sap_rescorer
from progressive_support import mlp_forward, mlp_tensors
from pruning_support import NAMES, batches, mlp, snapshot


def _draw(gen, theta, x_shape, reinit):
    if reinit:
        theta = [
            torch.randn(t.shape, generator=gen, dtype=torch.float64) * math.sqrt(2.0 / t.shape[1])
            for t in theta
        ]
    x = torch.randn(x_shape, generator=gen, dtype=torch.float64)
    delta = [torch.randn(t.shape, generator=gen, dtype=torch.float64) for t in theta]
    return theta, x, delta


def reference(model, x_shape, masks, gen, *, epsilon=0.01, repeats=1, reinit=True):
    """One round: J = Σ‖f(x; θ⊙m) − f(x; (θ+εδ)⊙m)‖² summed over draws, |∂J/∂m|⊙[m≠0]."""
    theta, bs = mlp_tensors(model)
    m = [mask.double().requires_grad_(True) for mask in masks]
    total = [torch.zeros_like(t) for t in theta]
    for _ in range(repeats):
        theta, x, delta = _draw(gen, theta, x_shape, reinit)
        f0 = mlp_forward([t * mi for t, mi in zip(theta, m)], bs, x)
        f1 = mlp_forward([(t + epsilon * d) * mi for t, d, mi in zip(theta, delta, m)], bs, x)
        for acc, g in zip(total, torch.autograd.grad(((f0 - f1) ** 2).sum(), m)):
            acc += g
    return [(g.abs() * (mask != 0)) for g, mask in zip(total, masks)]


@pytest.mark.parametrize("reinit", [True, False])
def test_ntk_sap_against_the_reference(reinit):
    model, data = mlp(), batches(1)
    ones = [torch.ones_like(model.get_parameter(n)) for n in NAMES]
    gen = torch.Generator().manual_seed(4)
    expected = reference(model, (12, 12), ones, gen, epsilon=0.1, repeats=3, reinit=reinit)
    got = gradsift.score(model, "ntk_sap", data, epsilon=0.1, repeats=3, reinit=reinit, seed=4)
    for n, e in zip(NAMES, expected):
        torch.testing.assert_close(got[n], e, rtol=1e-10, atol=1e-14)


def test_rounds_draw_afresh_and_respect_the_masks():
    model, data = mlp(), batches(1)
    before = snapshot(model)
    rescore = ntk_sap_rescorer(model, data, seed=2)
    first = rescore(None)
    assert all(
        torch.equal(first[n], s) for n, s in gradsift.score(model, "ntk_sap", data, seed=2).items()
    )
    masks = gradsift.masks_from_scores(first, 0.7)
    second = rescore(masks)
    gen = torch.Generator().manual_seed(2)
    reference(model, (12, 12), [torch.ones_like(masks[n]) for n in NAMES], gen)
    expected = reference(model, (12, 12), [masks[n] for n in NAMES], gen)
    for n, e in zip(NAMES, expected):
        torch.testing.assert_close(second[n], e, rtol=1e-10, atol=1e-14)
        assert (second[n][masks[n] == 0] == 0).all()
    assert torch.equal(before["rng"], torch.get_rng_state())  # generator only


def test_a_dropout_layer_leaves_the_scores_to_the_seed_alone():
    # the BatchNorm statistics pass ran the whole model in training mode, so a
    # Dropout drew its masks from the global generator: scores changed with it
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Flatten(), nn.Linear(12, 16), nn.Dropout(0.5), nn.BatchNorm1d(16), nn.ReLU(),
        nn.Linear(16, 3),
    )  # fmt: skip
    got = []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)
        got.append(gradsift.score(model, "ntk_sap", batches(1), seed=0))
    for n in got[0]:
        assert torch.equal(got[0][n], got[1][n]), n


def test_batchnorm_uses_the_unperturbed_batch_statistics_in_both_networks():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Flatten(), nn.Linear(12, 10), nn.BatchNorm1d(10), nn.ReLU(), nn.Linear(10, 3)
    ).double()
    with torch.no_grad():
        model[2].weight.uniform_(0.5, 2.0)  # reinit resets γ = 1, β = 0
        model[2].bias.uniform_(-1, 1)
    gen = torch.Generator().manual_seed(0)
    theta = [model[i].weight.detach() for i in (1, 4)]
    b1, b2 = model[1].bias.detach(), model[4].bias.detach()
    theta, x, delta = _draw(gen, theta, (16, 12), reinit=True)
    c = [torch.ones_like(t, requires_grad=True) for t in theta]
    h = x @ theta[0].T + b1
    mean, var = h.mean(0), h.var(0, unbiased=True)  # the statistics pass, no gradient

    def f(ws):
        z = (x @ ws[0].T + b1 - mean) / torch.sqrt(var + model[2].eps)
        return torch.relu(z) @ ws[1].T + b2

    moved = [(t + 0.01 * d) * ci for t, d, ci in zip(theta, delta, c)]
    j = ((f([t * ci for t, ci in zip(theta, c)]) - f(moved)) ** 2).sum()
    expected = [g.abs() for g in torch.autograd.grad(j, c)]
    got = gradsift.score(model, "ntk_sap", input_shape=(12,), batch_size=16)
    torch.testing.assert_close(got["1.weight"], expected[0], rtol=1e-10, atol=1e-14)
    torch.testing.assert_close(got["4.weight"], expected[1], rtol=1e-10, atol=1e-14)


def test_needs_a_shape():
    with pytest.raises(ValueError, match="input_shape= and batch_size="):
        gradsift.score(mlp(), "ntk_sap", input_shape=(12,))
    with pytest.raises(ValueError, match="reinit=False"):
        gradsift.score(mlp(), "ntk_sap", batches(1), params=["1.bias"])
