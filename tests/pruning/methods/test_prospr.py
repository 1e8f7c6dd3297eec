"""ProsPr against a float64 transcription of Alizadeh et al.'s meta-gradient: SGD
steps written out by hand on the MLP's tensors, and central finite differences."""

import pytest
import torch
from torch.nn import functional as F

import gradsift
from progressive_support import mlp_forward, mlp_tensors
from pruning_support import NAMES, batches, mlp


def reference_meta_loss(model, data, masks, steps, lr, momentum, new_batches):
    """L_M(w_M) as a function of the masks c, through ``steps`` SGD steps on
    every weight and bias (w_0 = θ ⊙ c)."""
    theta, bs = mlp_tensors(model)
    params = [t * c for t, c in zip(theta, masks)] + bs
    params = [p if p.requires_grad else p.requires_grad_(True) for p in params]
    velocity = [None] * len(params)
    batch = 0
    for _ in range(steps):
        x, y = data[batch % len(data)]
        loss = F.cross_entropy(mlp_forward(params[:3], params[3:], x), y)
        grads = torch.autograd.grad(loss, params, create_graph=True)
        for i, g in enumerate(grads):
            velocity[i] = g if velocity[i] is None or not momentum else momentum * velocity[i] + g
            params[i] = params[i] - lr * velocity[i]
        batch += 1 if new_batches else 0
    x, y = data[batch % len(data)]
    return F.cross_entropy(mlp_forward(params[:3], params[3:], x), y)


@pytest.mark.parametrize(
    "options",
    [
        {},  # the authors' defaults: 3 steps, lr 0.1, no momentum, one batch
        {"steps": 4, "lr": 0.3, "momentum": 0.9, "new_batches": True},  # cycles 3 batches
    ],
)
def test_prospr_against_the_hand_written_meta_gradient(options):
    model, data = mlp(), batches(3)
    full = {"steps": 3, "lr": 0.1, "momentum": 0.0, "new_batches": False, **options}
    masks = [torch.ones_like(model.get_parameter(n), requires_grad=True) for n in NAMES]
    meta = reference_meta_loss(model, data, masks, **full)
    expected = torch.autograd.grad(meta, masks)
    got = gradsift.score(model, "prospr", data, **options)
    for n, e in zip(NAMES, expected):
        torch.testing.assert_close(got[n], e.abs(), rtol=1e-10, atol=1e-14)


def test_prospr_matches_finite_differences():
    model, data = mlp(), batches(2)
    got = gradsift.score(model, "prospr", data, steps=2, lr=0.5)
    shapes = [model.get_parameter(n).shape for n in NAMES]
    h = 1e-6
    for layer, index in [(0, (3, 5)), (1, (2, 7)), (2, (1, 4))]:
        loss = []
        for sign in (1, -1):
            c = [torch.ones(s, dtype=torch.float64) for s in shapes]
            c[layer][index] += sign * h
            loss.append(reference_meta_loss(model, data, c, 2, 0.5, 0.0, False))
        fd = (loss[0] - loss[1]) / (2 * h)
        torch.testing.assert_close(got[NAMES[layer]][index], fd.abs(), rtol=1e-6, atol=1e-10)


def test_zero_steps_is_snip_and_pruned_weights_score_zero():
    model, data = mlp(), batches(2)
    snip = gradsift.score(model, "snip", data)
    got = gradsift.score(model, "prospr", data, steps=0)
    for n in NAMES:
        torch.testing.assert_close(got[n], snip[n], rtol=1e-12, atol=1e-15)
    masks = gradsift.masks_from_scores(snip, 0.5)
    gradsift.apply_masks_(model, masks)
    after = gradsift.score(model, "prospr", data)
    assert all((after[n][masks[n] == 0] == 0).all() for n in NAMES)
    assert all((after[n][masks[n] > 0] > 0).any() for n in NAMES)


def test_bad_options():
    with pytest.raises(ValueError, match="momentum must be in"):
        gradsift.score(mlp(), "prospr", batches(1), momentum=1.0)
    with pytest.raises(ValueError, match="lr must be in"):
        gradsift.score(mlp(), "prospr", batches(1), lr=0.0)
    with pytest.raises(ValueError, match="no batches"):
        gradsift.score(mlp(), "prospr", [])
