"""The baselines the benchmarks compare against do what they claim."""

import pytest
import torch

import gradsift
from gradsift.lab.baselines import naive_topk_step, reference_grasp_batches, reference_snip
from pruning_support import convnet


def test_naive_step_keeps_the_top_k_and_steps():
    gen = torch.Generator().manual_seed(0)
    ps = [torch.nn.Parameter(torch.zeros(s)) for s in [(4, 5), (7,)]]
    grads = [torch.randn(p.shape, generator=gen) for p in ps]
    for p, g in zip(ps, grads):
        p.grad = g.clone()
    naive_topk_step(ps, torch.optim.SGD(ps, lr=1.0), 5)
    flat = torch.cat([g.reshape(-1) for g in grads])
    keep = torch.zeros_like(flat, dtype=torch.bool)
    keep[torch.topk(flat.abs(), 5).indices] = True
    moved = torch.cat([p.detach().reshape(-1) for p in ps])
    torch.testing.assert_close(moved, torch.where(keep, -flat, 0.0), rtol=0, atol=0)


def _bn_cnn_batches():
    model = convnet().double()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(15, 1, 6, 6, generator=gen, dtype=torch.float64)
    y = torch.arange(3).repeat_interleave(5)
    return model, x, y, [(x[0:6], y[0:6]), (x[6:12], y[6:12]), (x[12:], y[12:])]


def test_synaptic_flow_grasp_is_gradsift_per_batch_on_a_batchnorm_cnn():
    """The Synaptic-Flow loop over 3 batches sums their means: 3x gradsift's g under
    ``batch_weighting="batch"`` and so 9x its θ ⊙ Hg, chunk for batch."""
    model, x, y, parts = _bn_cnn_batches()
    ref = reference_grasp_batches(model, parts)
    with pytest.warns(UserWarning, match="chunk_size=6"):
        ours = gradsift.score(
            model, "grasp", [(x, y)], samples_per_class=5, chunk_size=6, batch_weighting="batch"
        )
    for n in ref:
        torch.testing.assert_close(ref[n], 9 * ours[n], rtol=1e-9, atol=1e-20)


def test_reference_snip_sums_batch_means():
    model, _, _, parts = _bn_cnn_batches()
    ref = reference_snip(model, parts)
    ours = gradsift.score(model, "snip", parts, num_batches=None, batch_weighting="batch")
    for n in ref:
        torch.testing.assert_close(ref[n], 3 * ours[n], rtol=1e-12, atol=1e-20)
    one = gradsift.score(model, "snip", parts)  # the SNIP paper's single batch
    for n, s in reference_snip(model, parts[:1]).items():
        torch.testing.assert_close(s, one[n], rtol=1e-12, atol=1e-20)
