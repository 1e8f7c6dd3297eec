"""SNIP against an autograd reference of |g ⊙ θ|; batches of any structure."""

import pytest
import torch
from torch import nn

import gradsift
from pruning_support import NAMES, DictModel, batches, dict_data, flat_loss, mlp, unflatten


def test_snip_against_autograd_reference():
    model = mlp()
    data = batches(1)
    f, w = flat_loss(model, NAMES, data)
    g = torch.autograd.grad(f(w.requires_grad_()), w)[0]
    expected = unflatten((g * w.detach()).abs(), model, NAMES)
    got = gradsift.score(model, "snip", data)
    for n in NAMES:
        torch.testing.assert_close(got[n], expected[n], rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("batch_weighting", ["size", "batch"])
def test_snip_batch_weighting_against_hand_computation(batch_weighting):
    """Issue 16: over batches of 12 and 4 samples, ``"size"`` is the gradient of the
    mean over the 16 samples, ``"batch"`` the mean of the two batch means' gradients
    (the Synaptic-Flow repository sums them: the same ranking)."""
    model = mlp()
    data = batches(1, n=12) + batches(1, n=4, seed=1) + batches(1, n=8, seed=2)
    ws = [model.get_parameter(n) for n in NAMES]
    g = [torch.autograd.grad(nn.functional.cross_entropy(model(x), y), ws) for x, y in data]
    share = [12 / 16, 4 / 16] if batch_weighting == "size" else [1 / 2, 1 / 2]
    got = gradsift.score(
        model, "snip", data, num_batches=2, batch_weighting=batch_weighting
    )  # the third batch is not read
    for i, n in enumerate(NAMES):
        expected = ((share[0] * g[0][i] + share[1] * g[1][i]) * ws[i]).abs()
        torch.testing.assert_close(got[n], expected.detach(), rtol=1e-12, atol=1e-15)
    if batch_weighting == "size":  # a true mean: the same as one batch of all 16
        x, y = (torch.cat(t) for t in zip(*data[:2]))
        one = gradsift.score(model, "snip", [(x, y)])
        for n in NAMES:
            torch.testing.assert_close(got[n], one[n], rtol=1e-12, atol=1e-15)


def test_snip_equal_batches_weigh_alike_and_options_are_checked():
    model, data = mlp(), batches(3)
    a = gradsift.score(model, "snip", data, num_batches=None, batch_weighting="size")
    b = gradsift.score(model, "snip", data, num_batches=None, batch_weighting="batch")
    for n in NAMES:
        torch.testing.assert_close(a[n], b[n], rtol=0, atol=0)
    with pytest.raises(ValueError, match="batch_weighting must be one of"):
        gradsift.score(model, "snip", data, batch_weighting="sample")


def _split(batch):
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    return inputs, batch["labels"]


def _logits_loss(out, y):
    return nn.functional.cross_entropy(out["logits"], y)


@pytest.mark.parametrize("method", ["snip", "grasp"])
def test_dict_batches_through_split_batch(method):
    """Issue 15, case 15: Hugging Face style batches (a dict of tensors, the model
    called with keywords, a custom loss) through ``split_batch``; a dict and the
    same tensors as positional inputs give the same scores."""
    model, data = DictModel(), dict_data()
    grasp_options = {"samples_per_class": 2, "num_classes": 3, "temperature": 1.0}
    options = grasp_options if method == "grasp" else {}
    by_name = gradsift.score(
        model, method, data, loss_fn=_logits_loss, split_batch=_split, **options
    )

    def positional(batch):
        return (batch["attention_mask"], batch["input_ids"]), batch["labels"]

    by_position = gradsift.score(
        model, method, data, loss_fn=_logits_loss, split_batch=positional, **options
    )
    assert list(by_name) == ["body.1.weight", "classifier.weight"]
    for n in by_name:
        torch.testing.assert_close(by_name[n], by_position[n], rtol=0, atol=0)
        assert by_name[n].abs().sum() > 0
    if method == "snip":  # against autograd by hand
        inputs, y = _split(data[0])
        ws = [model.get_parameter(n) for n in by_name]
        grads = torch.autograd.grad(_logits_loss(model(**inputs), y), ws)
        for n, w, g in zip(by_name, ws, grads):
            torch.testing.assert_close(by_name[n], (g * w).abs().detach())


@pytest.mark.parametrize("method", ["snip", "grasp"])
def test_batches_that_are_not_pairs_say_what_is_supported(method):
    options = {"num_classes": 3} if method == "grasp" else {}
    with pytest.raises(TypeError, match=r"\(inputs, targets\) pairs.*split_batch="):
        gradsift.score(DictModel(), method, dict_data(), loss_fn=_logits_loss, **options)


def test_grasp_needs_num_classes_when_the_output_is_not_a_tensor():
    with pytest.raises(ValueError, match="num_classes="):
        gradsift.score(DictModel(), "grasp", dict_data(), loss_fn=_logits_loss, split_batch=_split)


class Dangling(nn.Module):
    def __init__(self):
        super().__init__()
        self.used, self.unused = nn.Linear(4, 3), nn.Linear(4, 3)

    def forward(self, x):
        return self.used(x)


def test_a_weight_the_loss_does_not_reach_scores_zero():
    """Its gradient is zero, so ``|g ⊙ θ| = 0``; the others are autograd's, and the
    caller's weights (which the scoring copy shares) are untouched."""
    torch.manual_seed(0)
    model = Dangling()
    before = {n: p.clone() for n, p in model.named_parameters()}
    x, y = torch.randn(5, 4), torch.tensor([0, 1, 2, 0, 1])
    got = gradsift.score(model, "snip", [(x, y)], params=["used.weight", "unused.weight"])
    g = torch.autograd.grad(nn.functional.cross_entropy(model(x), y), model.used.weight)[0]
    torch.testing.assert_close(got["used.weight"], (g * model.used.weight).abs(), rtol=0, atol=0)
    assert torch.equal(got["unused.weight"], torch.zeros(3, 4))
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]) and p.grad is None and p.requires_grad
