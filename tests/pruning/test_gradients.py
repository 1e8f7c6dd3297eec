"""``GradBuffers``: gradients accumulated in place in one flat buffer, plain ``Linear``
weights by ``AccumulatingLinear`` (no weight-sized gradient from autograd), against
autograd's gradients."""

import torch
from torch import nn

from gradsift.pruning.gradients import GradBuffers


class TiedLM(nn.Module):
    """Token ids -> embedding -> Linear -> output projection tied to the embedding."""

    def __init__(self, first_is_head: bool):
        super().__init__()
        torch.manual_seed(0)
        self.head_first = first_is_head
        self.emb = nn.Embedding(11, 6, dtype=torch.float64)
        self.mid = nn.Linear(6, 6, dtype=torch.float64)
        self.head = nn.Linear(6, 11, bias=False, dtype=torch.float64)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(torch.tanh(self.mid(self.emb(ids))))


def _targets(model, first_is_head):
    head = (model.head, "weight") if first_is_head else (model.emb, "weight")
    return {"mid.weight": (model.mid, "weight"), "tied": head}


def _loss(model, seed):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 11, (3, 5), generator=gen)  # a batch of sequences: 3-D input
    return model(ids).square().mean()


def _reference(first_is_head, scales):
    model = TiedLM(first_is_head)
    ws = [model.mid.weight, model.emb.weight]
    total = [torch.zeros_like(w) for w in ws]
    for seed, s in enumerate(scales):
        for t, g in zip(total, torch.autograd.grad(_loss(model, seed), ws)):
            t += g * s
    return total


def test_one_batch_equals_autograd_bit_for_bit():
    for first_is_head in (True, False):
        model = TiedLM(first_is_head)
        buffers = GradBuffers(_targets(model, first_is_head))
        buffers.accumulate_(_loss(model, 0))
        got = buffers.release_()
        for g, expected in zip(got, _reference(first_is_head, [1.0])):
            torch.testing.assert_close(g, expected, rtol=0, atol=0)


def test_weighted_batches_equal_autograd():
    for first_is_head in (True, False):
        model = TiedLM(first_is_head)
        buffers = GradBuffers(_targets(model, first_is_head))
        for seed, s in enumerate([1.0, 0.25, 3.0]):
            buffers.accumulate_(_loss(model, seed), s)
        got = buffers.release_()
        for g, expected in zip(got, _reference(first_is_head, [1.0, 0.25, 3.0])):
            torch.testing.assert_close(g, expected, rtol=1e-14, atol=1e-15)


def test_a_plain_linear_gets_no_weight_gradient_from_autograd():
    model = TiedLM(True)
    buffers = GradBuffers(_targets(model, True))
    delivered = []
    model.mid.weight.register_hook(lambda g: delivered.append(g))
    buffers.accumulate_(_loss(model, 0))
    assert delivered == [None]  # added in place by AccumulatingLinear's backward
    assert "forward" in vars(model.mid)
    buffers.release_()
    assert "forward" not in vars(model.mid)  # the layer's own forward again
    assert model.mid.weight.grad is None and not model.mid.weight.requires_grad


def test_the_gradients_share_one_flat_buffer():
    model = TiedLM(True)
    buffers = GradBuffers(_targets(model, True))
    grads = [w.grad for w in buffers.weights]
    base = grads[0].untyped_storage().data_ptr()
    assert all(g.untyped_storage().data_ptr() == base for g in grads)
