"""``GradBuffers``: gradients accumulated in place in one flat buffer, plain ``Linear``
weights by ``AccumulatingLinear`` (no weight-sized gradient from autograd), against
autograd's gradients."""

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

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


class Checkpointed(nn.Module):
    """Linear -> checkpointed (Linear, tanh) -> Linear, float32."""

    def __init__(self, checkpointed: bool):
        super().__init__()
        torch.manual_seed(0)
        self.checkpointed = checkpointed
        self.a, self.b, self.c = nn.Linear(5, 7), nn.Linear(7, 7), nn.Linear(7, 3)

    def forward(self, x):
        h = torch.tanh(self.a(x))
        inner = lambda t: torch.tanh(self.b(t))  # noqa: E731
        h = checkpoint(inner, h, use_reentrant=False) if self.checkpointed else inner(h)
        return self.c(h)


def _batch(seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(6, 5, generator=gen)


@pytest.mark.parametrize("case", ["autocast", "checkpoint"])
def test_autocast_and_activation_checkpointing_equal_autograd_bit_for_bit(case):
    """Under bf16 autocast the weight gradient is the low-precision product cast back;
    in a checkpointed region the recomputed forward saves another weight tensor.
    Both as autograd computes them (the autocast path over weighted batches: it is
    autograd's own; ``addmm_`` rounds a later batch's sum once)."""
    amp = torch.autocast("cpu", dtype=torch.bfloat16, enabled=case == "autocast")
    scales = [1.0, 0.25] if case == "autocast" else [1.0]
    model = Checkpointed(case == "checkpoint")
    ws = [model.a.weight, model.b.weight, model.c.weight]
    expected = [torch.zeros_like(w) for w in ws]
    for seed, s in enumerate(scales):
        with amp:
            loss = model(_batch(seed)).float().square().mean()
        for t, g in zip(expected, torch.autograd.grad(loss, ws)):
            t += g * s
    model.requires_grad_(False)
    buffers = GradBuffers({n: (getattr(model, n), "weight") for n in "abc"})
    for seed, s in enumerate(scales):
        with amp:
            loss = model(_batch(seed)).float().square().mean()
        buffers.accumulate_(loss, s)
    for g, e in zip(buffers.release_(), expected):
        torch.testing.assert_close(g, e, rtol=0, atol=0)
