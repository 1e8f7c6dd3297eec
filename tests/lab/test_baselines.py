"""The baselines the benchmarks compare against do what they claim."""

import torch

from gradsift.lab.baselines import naive_topk_step


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
