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


def equivalence(rank, world):
    """Gradients with the hook at density 1.0 vs plain allreduce, over several steps."""
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
    return rank, diffs


def low_density(rank, world):
    """Sparse steps keep ranks identical; digits training still learns."""
    from gradsift.lab.data import digits
    from gradsift.lab.models import build_model
    from gradsift.lab.training import evaluate

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
    return rank, identical, acc, state.compression_ratio, len(state.residuals)


def _train_steps(ddp, opt, rank, steps):
    for step in steps:
        x, y = batch(rank, step)
        opt.zero_grad()
        F.cross_entropy(ddp(x), y).backward()
        opt.step()


def resume(rank, world):
    """Save model + optimizer + hook state mid-run; a fresh run continues bit for bit."""

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
    residual_norm = float(ckpt["hook"]["residual"].norm())
    model, ddp, state, opt = fresh()
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["opt"])
    state.load_state_dict(ckpt["hook"])
    _train_steps(ddp, opt, rank, range(4, 8))
    return rank, torch.equal(full, flat_params(model)), residual_norm


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


def bucketed_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(
        *[m for _ in range(4) for m in (nn.Linear(40, 40), nn.ReLU())], nn.Linear(40, 5)
    )


def batch40(rank, step):
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 40, generator=gen), torch.randint(0, 5, (16,), generator=gen)


def _steps(ddp, opt, rank, steps, seen=None):
    for step in steps:
        x, y = batch40(rank, step)
        opt.zero_grad()
        F.cross_entropy(ddp(x), y).backward()
        opt.step()


def resume_buckets(rank, world, cap_mb):
    """Resume mid-run with a fresh DDP whose buckets are laid out afresh."""

    def fresh():
        model = bucketed_model()
        ddp = DDP(model, bucket_cap_mb=cap_mb)
        state = TopKHookState(density=0.05)
        buckets = []

        def counting(st, bucket):
            buckets.append(bucket.index())
            return topk_hook(st, bucket)

        ddp.register_comm_hook(state, counting)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
        return model, ddp, state, opt, buckets

    model, ddp, state, opt, buckets = fresh()
    _steps(ddp, opt, rank, range(8))
    full, per_step = flat_params(model), max(buckets) + 1  # after DDP rebuilds them
    model, ddp, state, opt, _ = fresh()
    _steps(ddp, opt, rank, range(4))
    ckpt = {"model": model.state_dict(), "opt": opt.state_dict(), "hook": state.state_dict()}
    model, ddp, state, opt, buckets = fresh()
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["opt"])
    state.load_state_dict(ckpt["hook"])
    _steps(ddp, opt, rank, range(4, 8))
    return rank, torch.equal(full, flat_params(model)), per_step, buckets[: len(buckets) // 4]


def scaler_skip(rank, world):
    """An inf on one rank under GradScaler: the step is skipped on both, state kept."""
    model = small_model()
    ddp = DDP(model)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    state = TopKHookState(density=0.1, start_iter=0, grad_scaler=scaler)
    ddp.register_comm_hook(state, topk_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    results = {}
    for step in range(6):
        x, y = batch(rank, step)
        if step == 3 and rank == 1:
            x = x * float("inf")
        if step == 3:
            before = (flat_params(model), state.residual.clone())
        opt.zero_grad()
        scaler.scale(F.cross_entropy(ddp(x), y)).backward()
        scaler.step(opt)
        scaler.update()
        if step == 3:
            after = (flat_params(model), state.residual.clone())
            results["skipped"] = torch.equal(before[0], after[0])
            results["residual_kept"] = torch.equal(before[1], after[1])
            results["scale"] = scaler.get_scale()
    results["identical"] = same_on_all_ranks(flat_params(model))
    results["moved_after"] = not torch.equal(after[0], flat_params(model))
    return rank, results


def dgc_two_ranks(rank, world):
    """The hook with momentum correction vs a float64 transcription of DGC (Alg. 1)."""
    lr, m, k, steps = 0.1, 0.9, 40, 5
    model = small_model().double()
    ref = [p.detach().clone() for p in small_model().double().parameters()]
    ddp = DDP(model)
    ddp.register_comm_hook(TopKHookState(k=k, momentum_correction=m, start_iter=0), topk_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=lr)
    n = sum(p.numel() for p in ref)
    u = [torch.zeros(n, dtype=torch.float64) for _ in range(world)]
    v = [torch.zeros(n, dtype=torch.float64) for _ in range(world)]
    for step in range(steps):
        x, y = batch(rank, step)
        opt.zero_grad()
        F.cross_entropy(ddp(x.double()), y).backward()
        opt.step()
        update = torch.zeros(n, dtype=torch.float64)
        for r in range(world):  # the reference sees every rank's batch
            leaves = [p.clone().requires_grad_() for p in ref]
            xr, yr = batch(r, step)
            out = torch.func.functional_call(
                small_model().double(),
                dict(zip([name for name, _ in small_model().named_parameters()], leaves)),
                (xr.double(),),
            )
            g = torch.cat(
                [t.reshape(-1) for t in torch.autograd.grad(F.cross_entropy(out, yr), leaves)]
            )
            u[r] = m * u[r] + g
            v[r] = v[r] + u[r]
            top = torch.sort(-v[r].abs(), stable=True).indices[:k]
            update[top] += v[r][top]
            v[r][top] = 0
            u[r][top] = 0
        flat = torch.cat([p.reshape(-1) for p in ref]) - lr * update / world
        ref = [t.view_as(p) for t, p in zip(torch.split(flat, [p.numel() for p in ref]), ref)]
    diff = float((flat_params(model) - torch.cat([p.reshape(-1) for p in ref])).abs().max())
    return rank, diff


# the settings that decide the collectives, each differing on rank 1 alone (a
# warm-up on one rank: allreduce per bucket there, the header all-gather on rank 0)
SETTINGS = {
    "k (density, k or warm-up)": {"density": 0.2},
    "value_dtype": {"value_dtype": torch.bfloat16},
    "encoding": {"encoding": "int64"},
    "dense_if_larger": {"dense_if_larger": False},
    "start_iter": {"start_iter": 1},
}


MISMATCHES = ["model", "find_unused", "error_feedback", "resumed", *SETTINGS]


def mismatched_states(rank, world, port, queue):
    """Each case of ``MISMATCHES`` in turn, on one world (the header exchange that
    fails completes on every rank first, so the group serves the next case): rank 1
    resumes the hook from another model's state (or, ``"find_unused"``, holds unused
    parameters out where rank 0 does not; ``"error_feedback"``, both hold out but rank
    1 keeps no residual, so runs no hold-out collective; or one setting of
    ``SETTINGS`` differs). One ``(rank, [(case, message, seconds)])`` per rank."""
    init(rank, world, port, timeout_s=20)
    results = [(how, *_mismatched(rank, how)) for how in MISMATCHES]
    queue.put((rank, results))
    dist.destroy_process_group()


def _mismatched(rank, how):
    ddp = DDP(small_model())
    unused = (how == "find_unused" and rank == 1) or how == "error_feedback"
    feedback = not (how == "error_feedback" and rank == 1)
    settings = dict(density=0.1, start_iter=0)
    if rank == 1:  # one setting of rank 1's state differs (SETTINGS)
        settings.update(SETTINGS.get(how, {}))
    state = TopKHookState(**settings, find_unused_parameters=unused, error_feedback=feedback)
    if how == "resumed":  # rank 0 resumed at step 3; rank 1 forgot to load: its warm-up
        state.start_iter = 2
        state.iter = 3 if rank == 0 else 0
    if rank == 1 and how == "model":
        other = TopKHookState(density=0.1)
        from gradsift.distributed import compress_

        compress_(other, torch.randn(100), [(0, 0)], [100])
        state.load_state_dict(other.state_dict())
    ddp.register_comm_hook(state, topk_hook)
    start = time.monotonic()
    try:
        _train_steps(ddp, torch.optim.SGD(ddp.parameters(), lr=0.1), rank, range(2))
        return "no error", 0.0
    except Exception as exc:  # noqa: BLE001 - the message is what is checked
        return f"{type(exc).__name__}: {exc}"[:400], time.monotonic() - start


def raises(rank, world, port, queue):
    """Rank 1 raises mid-training (and exits); rank 0 must fail with an error, not hang."""
    init(rank, world, port, timeout_s=10)
    ddp = DDP(small_model())
    ddp.register_comm_hook(TopKHookState(density=0.1), topk_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    _train_steps(ddp, opt, rank, range(3))
    if rank == 1:
        raise RuntimeError("rank 1 breaks on purpose")
    start = time.monotonic()
    try:
        _train_steps(ddp, opt, rank, range(3, 6))
        queue.put((rank, "no error", time.monotonic() - start))
    except Exception as exc:  # noqa: BLE001 - any error type is fine, hanging is not
        queue.put((rank, f"{type(exc).__name__}: {exc}"[:400], time.monotonic() - start))


def fail_on_rank_one(rank, port):
    """Rank 1 raises; rank 0 waits in a collective that can never complete."""
    init(rank, 2, port, timeout_s=30)
    if rank == 1:
        raise ValueError("bad input on rank 1")
    dist.barrier()


ABORTS = "a variant whose rank 1 aborts"


def abort_in_variant(rank, world, port, model_name, name, steps, batch, out):
    """``gradsift bench ddp``'s rank job, except that rank 1 of the variant named
    ``ABORTS`` dies by SIGABRT (a deterministic stand-in for a native crash)."""
    from gradsift.lab.bench import ddp_step

    if name == ABORTS:
        init(rank, world, port)
        if rank == 1:
            os.abort()
        dist.barrier()  # rank 0 waits here until it is stopped
    ddp_step._job(rank, world, port, model_name, name, steps, batch, out)


def abort_after_variant(rank, world, port, model_name, name, steps, batch, out):
    """``gradsift bench ddp``'s rank job, after which rank 1 dies by SIGABRT (a
    stand-in for a crash in the process group's teardown)."""
    from gradsift.lab.bench import ddp_step

    ddp_step._job(rank, world, port, model_name, name, steps, batch, out)
    if rank == 1:
        os.abort()


def another_ranks_state(rank, world, port, queue, case):
    """Resume the hook from a per-rank checkpoint gone wrong: ``"rank 0's"`` (every
    rank loads rank 0's state), ``"world 4"`` (a state saved by 4 ranks), or
    ``"reshard"`` (that state loaded with ``reshard=True``: accepted)."""
    init(rank, world, port, timeout_s=20)

    def fresh():
        ddp = DDP(small_model())
        state = TopKHookState(density=0.1, start_iter=0)
        ddp.register_comm_hook(state, topk_hook)
        return ddp, state, torch.optim.SGD(ddp.parameters(), lr=0.1)

    ddp, state, opt = fresh()
    _train_steps(ddp, opt, rank, range(3))
    saved = [None] * world
    dist.all_gather_object(saved, state.state_dict())
    names = (saved[rank].get("rank"), saved[rank].get("world_size"))
    ddp, state, opt = fresh()
    start = time.monotonic()
    try:
        if case == "rank 0's":
            state.load_state_dict(saved[0])
        else:
            state.load_state_dict({**saved[rank], "world_size": 4}, reshard=case == "reshard")
        _train_steps(ddp, opt, rank, range(3, 5))
        queue.put((rank, "no error", time.monotonic() - start, names))
    except Exception as exc:  # noqa: BLE001 - the message is what is checked
        queue.put((rank, f"{type(exc).__name__}: {exc}"[:600], time.monotonic() - start, names))
    dist.destroy_process_group()


def lightning_fit(rank, world, port, queue):
    """Lightning's DDP on CPU gloo ranks (processes launched by us, as by torchrun)
    with gradsift's callback: the hook runs (``state.iter > 0``), with the loss
    scaler of Lightning's float16 mixed precision (a CPU ``GradScaler``)."""
    import lightning.pytorch as pl
    from lightning.pytorch.plugins import MixedPrecision

    from gradsift.integrations.lightning import TopKHookCallback

    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world),
        RANK=str(rank), LOCAL_RANK=str(rank), NODE_RANK="0",
    )  # fmt: skip

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = small_model()

        def training_step(self, b, _):
            return F.cross_entropy(self.net(b[0]), b[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    gen = torch.Generator().manual_seed(rank)
    data = torch.utils.data.TensorDataset(
        torch.randn(64, 20, generator=gen), torch.randint(0, 5, (64,), generator=gen)
    )
    state = TopKHookState(density=0.1, start_iter=1)
    scaler = torch.amp.GradScaler("cpu")
    trainer = pl.Trainer(
        accelerator="cpu", devices=world, strategy="ddp", max_steps=4,
        plugins=[MixedPrecision("16-mixed", "cpu", scaler=scaler)],
        callbacks=[TopKHookCallback(state)], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(Module(), torch.utils.data.DataLoader(data, batch_size=16))
    ranks = dist.get_world_size()
    queue.put((rank, state.iter, state.compression_ratio, ranks, state.grad_scaler is scaler))
    dist.destroy_process_group()


def bench_variants(rank, world, names):
    """``gradsift bench ddp``'s row of each variant in ``names`` (a 5-step MLP)."""
    from gradsift.lab.bench.ddp_step import _run_variant

    return [_run_variant(name, "mlp", 5, 4, rank, world) for name in names]


def epoch_losses(rank, world):
    """``fit``'s mean training loss on ranks that hold different data, at learning rate
    0 (every loss is the initial model's): this rank's own mean, and the one reported."""
    from gradsift.lab.training import fit

    model = small_model()
    x, y = batch(rank, 0)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4)
    reported = []
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    fit(model, opt, data, epochs=1, on_epoch=lambda epoch, mean: reported.append(mean))
    with torch.no_grad():
        own = F.cross_entropy(model(x), y).item()
    return own, reported[0]


def write_environ(rank, name, out):
    """Write this process's ``os.environ[name]`` (or "unset") to ``out`` + rank."""
    with open(f"{out}{rank}", "w") as f:
        f.write(os.environ.get(name, "unset"))


def nccl_one_rank(rank, port, out):
    """One NCCL rank on cuda:0: all-reduce a tensor made on the device, write the sum."""
    torch.cuda.set_device(0)
    url = f"tcp://127.0.0.1:{port}"
    dist.init_process_group("nccl", rank=rank, world_size=1, init_method=url)
    t = torch.arange(4.0, device="cuda")
    dist.all_reduce(t)
    with open(out, "w") as f:
        f.write(repr(float(t.sum())))
    dist.destroy_process_group()
