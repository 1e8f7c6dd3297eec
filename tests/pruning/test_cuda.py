"""Every registered criterion on CUDA: exact counts, masks on the model's device, the
pruned model trains, float64 scores equal the CPU's. Skips where no GPU is present
(see ``test_devices.py`` for the CPU-side guards)."""

import pytest
import torch
from torch import nn
from torch.nn.utils import prune

import gradsift
from gradsift import prune_at_init
from pruning_support import convnet

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"
)

METHODS = gradsift.list_methods()
SPARSITY = 0.9


def net(dtype=torch.float32):
    """Conv + BatchNorm + two Linear layers, ~75k weights: above the selection's dense
    cutoff (65,536), so the sampled path runs, as on a real model."""
    return convnet(hidden=512).to(dtype)


def data(device, dtype=torch.float32, n_batches=2, n=45):  # GraSP: 25 per class
    gen = torch.Generator().manual_seed(0)
    return [
        (
            torch.randn(n, 1, 6, 6, generator=gen, dtype=dtype).to(device),
            (torch.arange(n) % 3).to(device),
        )
        for _ in range(n_batches)
    ]


def iterations(method):
    # the paper's rounds (SynFlow: 100): near the end, rounds keep almost every live
    # weight, so the selection sees pruned weights at the k-th position
    return min(gradsift.pruning.get_method(method).paper_iterations, 100)


@pytest.mark.parametrize("method", METHODS)
def test_every_method_prunes_exactly_on_cuda_and_trains(method):
    model = net().cuda()
    batches = data("cuda")
    masks = prune_at_init(model, method, SPARSITY, batches, iterations=iterations(method))
    total = sum(m.numel() for m in masks.values())
    assert sum(int(m.sum()) for m in masks.values()) == total - round(SPARSITY * total)
    for name, mask in masks.items():
        module = model.get_submodule(name.rsplit(".", 1)[0])
        assert mask.device.type == "cuda", name
        assert module.weight_mask.device.type == "cuda", name
        assert torch.equal(module.weight_mask, mask.to(module.weight_mask))
    assert prune.is_pruned(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = batches[0]
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    assert torch.isfinite(loss)
    for name, mask in masks.items():
        weight = model.get_submodule(name.rsplit(".", 1)[0]).weight
        assert (weight[mask == 0] == 0).all(), name


@pytest.mark.parametrize("method", METHODS)
def test_float64_scores_on_cuda_equal_the_cpus(method):
    cpu = net(torch.float64)
    gpu = net(torch.float64).cuda()
    ours = gradsift.score(gpu, method, data("cuda", torch.float64))
    ref = gradsift.score(cpu, method, data("cpu", torch.float64))
    for name in ref:
        assert ours[name].device.type == "cuda"
        a, b = ours[name].cpu(), ref[name]
        scale = float(b.abs().max()) or 1.0
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12 * scale, msg=name)


@pytest.mark.parametrize("sparsity", [0.5, 0.99])
def test_selection_with_previous_masks_on_cuda(sparsity):
    """The reported crash: pruned weights (the selection's dead keys) sampled near the
    k-th position sent a CPU tensor to ``nextafter`` with a CUDA one."""
    gen = torch.Generator().manual_seed(0)
    scores = {"a": torch.randn(300_000, generator=gen), "b": torch.randn(1000, generator=gen)}
    first = gradsift.masks_from_scores(scores, 0.4)
    ours = gradsift.masks_from_scores(
        {k: v.cuda() for k, v in scores.items()},
        sparsity,
        previous={k: v.cuda() for k, v in first.items()},
    )
    ref = gradsift.masks_from_scores(scores, sparsity, previous=first)
    for name in ref:
        assert ours[name].device.type == "cuda"
        assert torch.equal(ours[name].cpu(), ref[name]), name
