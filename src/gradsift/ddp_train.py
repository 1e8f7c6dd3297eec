"""Data-parallel training on CPU (gloo) or GPU (NCCL) with the top-k comm hook.

``gradsift train --nproc N`` spawns N local processes; under ``torchrun`` (which sets
``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT``) each process joins directly:
``torchrun --nproc-per-node 2 -m gradsift train --density 0.01 ...``.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from gradsift.data import load_dataset
from gradsift.distributed import TopKHookState, topk_hook
from gradsift.io import atomic_write_json
from gradsift.models import build_model
from gradsift.pruning import sparsity_report
from gradsift.runs import RunSpec, prune_for_spec
from gradsift.train import evaluate

__all__ = ["train_ddp", "spawn", "free_port", "under_torchrun"]

log = logging.getLogger(__name__)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def under_torchrun() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ


def _init(rank: int, world: int, timeout_s: float) -> None:
    backend = "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= world else "gloo"
    dist.init_process_group(
        backend, rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s)
    )


def train_ddp(
    spec: RunSpec, *, rank: int, world: int, out: str | None = None, timeout_s: float = 120.0
) -> dict | None:
    """Train ``spec`` data-parallel; rank 0 returns (and writes) the result record."""
    _init(rank, world, timeout_s)
    try:
        return _train(spec, rank, world, out)
    finally:
        dist.destroy_process_group()


def _train(spec: RunSpec, rank: int, world: int, out: str | None) -> dict | None:
    cfg = spec.train
    torch.manual_seed(spec.seed)  # same initial model everywhere (DDP also broadcasts it)
    ds = load_dataset(spec.dataset, root=spec.data_root)
    model = build_model(spec.model, input_shape=ds.input_shape, num_classes=ds.num_classes)
    prune_for_spec(model, ds, spec)
    ddp = DistributedDataParallel(model)
    state = None
    if cfg.density is not None or cfg.k is not None:
        state = TopKHookState(density=cfg.density, k=cfg.k, error_feedback=cfg.error_feedback)
        ddp.register_comm_hook(state, topk_hook)
    opt = torch.optim.SGD(
        ddp.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay
    )
    sampler = DistributedSampler(
        ds.train, num_replicas=world, rank=rank, shuffle=True, seed=spec.seed
    )
    data = DataLoader(ds.train, batch_size=cfg.batch_size, sampler=sampler)
    start = time.perf_counter()
    for epoch in range(cfg.epochs):
        sampler.set_epoch(epoch)
        for x, y in data:
            opt.zero_grad()
            F.cross_entropy(ddp(x), y).backward()
            opt.step()
    seconds = time.perf_counter() - start
    if rank != 0:
        return None
    metrics = evaluate(model, ds.test)
    record = {
        "key": spec.key(),
        "model": spec.model,
        "dataset": spec.dataset,
        "method": spec.method or "unpruned",
        "sparsity": spec.sparsity,
        "seed": spec.seed,
        "world_size": world,
        "grad_density": cfg.density if cfg.density is not None else 1.0,
        "error_feedback": cfg.error_feedback,
        "epochs": cfg.epochs,
        "kept": sparsity_report(model).kept,
        "test_accuracy": metrics["accuracy"],
        "test_loss": metrics["loss"],
        "seconds": seconds,
        "compression_ratio": state.compression_ratio if state else 1.0,
    }
    if out:
        atomic_write_json(os.path.join(out, "result.json"), record)
    return record


def _worker(rank: int, world: int, port: int, spec: RunSpec, out, queue) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    record = train_ddp(spec, rank=rank, world=world, out=out)
    if rank == 0:
        queue.put(record)


def spawn(spec: RunSpec, nproc: int, *, out: str | None = None) -> dict:
    """Run ``train_ddp`` in ``nproc`` local processes; return rank 0's record."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = free_port()
    mp.start_processes(
        _worker, args=(nproc, port, spec, out, queue), nprocs=nproc, join=True, start_method="spawn"
    )
    return queue.get()
