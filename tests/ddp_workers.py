"""Worker functions for the 2-process gloo tests (spawned: must be importable)."""

import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: N817

from gradsift.distributed import TopKHookState, topk_hook


def init(rank, world, port, timeout_s=30):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group(
        "gloo", rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s)
    )


def small_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 5)
    )


def batch(rank, step):
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 20, generator=gen), torch.randint(0, 5, (16,), generator=gen)


def flat_params(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def same_on_all_ranks(t):
    gathered = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, t)
    return all(torch.equal(gathered[0], g) for g in gathered)


def equivalence(rank, world, port, queue):
    """Gradients with the hook at density 1.0 vs plain allreduce, over several steps."""
    init(rank, world, port)
    diffs = []
    for dense_if_larger in (True, False):
        ref = DDP(small_model())
        hooked = DDP(small_model())
        hooked.register_comm_hook(
            TopKHookState(density=1.0, start_iter=2, dense_if_larger=dense_if_larger), topk_hook
        )
        for step in range(5):
            x, y = batch(rank, step)
            for m in (ref, hooked):
                m.zero_grad()
                F.cross_entropy(m(x), y).backward()
            diff = max(
                float((a.grad - b.grad).abs().max())
                for a, b in zip(ref.parameters(), hooked.parameters())
            )
            diffs.append(diff)
    queue.put((rank, diffs))
    dist.destroy_process_group()


def low_density(rank, world, port, queue):
    """Sparse steps keep ranks identical; digits training still learns."""
    from gradsift.lab.data import digits
    from gradsift.lab.models import build_model
    from gradsift.lab.training import evaluate

    init(rank, world, port)
    ds = digits()
    torch.manual_seed(0)
    model = build_model("mlp", input_shape=ds.input_shape, num_classes=10)
    ddp = DDP(model)
    state = TopKHookState(density=0.01)
    ddp.register_comm_hook(state, topk_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    x_all, y_all = ds.train.tensors
    identical = True
    gen = torch.Generator().manual_seed(rank)
    for step in range(300):
        idx = torch.randint(0, len(y_all), (32,), generator=gen)
        opt.zero_grad()
        F.cross_entropy(ddp(x_all[idx]), y_all[idx]).backward()
        opt.step()
        if step % 25 == 0 or step == 299:
            identical &= same_on_all_ranks(flat_params(model))
    acc = evaluate(model, ds.test)["accuracy"]
    queue.put((rank, identical, acc, state.compression_ratio, len(state.residuals)))
    dist.destroy_process_group()


def _train_steps(ddp, opt, rank, steps):
    for step in steps:
        x, y = batch(rank, step)
        opt.zero_grad()
        F.cross_entropy(ddp(x), y).backward()
        opt.step()


def resume(rank, world, port, queue):
    """Save model + optimizer + hook state mid-run; a fresh run continues bit for bit."""
    init(rank, world, port)

    def fresh():
        model = small_model()
        ddp = DDP(model)
        state = TopKHookState(density=0.05)
        ddp.register_comm_hook(state, topk_hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
        return model, ddp, state, opt

    model, ddp, state, opt = fresh()
    _train_steps(ddp, opt, rank, range(8))
    full = flat_params(model)

    model, ddp, state, opt = fresh()
    _train_steps(ddp, opt, rank, range(4))
    ckpt = {"model": model.state_dict(), "opt": opt.state_dict(), "hook": state.state_dict()}
    residual_norm = sum(float(r.norm()) for r in ckpt["hook"]["residuals"].values())
    model, ddp, state, opt = fresh()
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["opt"])
    state.load_state_dict(ckpt["hook"])
    _train_steps(ddp, opt, rank, range(4, 8))
    queue.put((rank, torch.equal(full, flat_params(model)), residual_norm))
    dist.destroy_process_group()


def dies(rank, world, port, queue):
    """Rank 1 vanishes after one step; rank 0 must fail with an error, not hang."""
    init(rank, world, port, timeout_s=10)
    ddp = DDP(small_model())
    ddp.register_comm_hook(TopKHookState(density=0.1), topk_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    _train_steps(ddp, opt, rank, range(3))
    if rank == 1:
        os._exit(0)
    start = time.monotonic()
    try:
        _train_steps(ddp, opt, rank, range(3, 6))
        queue.put((rank, "no error", time.monotonic() - start))
    except Exception as exc:  # noqa: BLE001 - any error type is fine, hanging is not
        queue.put((rank, f"{type(exc).__name__}: {exc}"[:300], time.monotonic() - start))
