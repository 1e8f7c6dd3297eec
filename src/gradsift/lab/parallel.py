"""Data-parallel training on CPU (gloo) or GPU (NCCL) with the top-k comm hook, or
sharded with FSDP2 and ``TopK`` (``fsdp_setup``): the process group and one rank's
``Setup`` for ``training.train_run``.

The backend follows ``--device``: ``cuda`` uses NCCL with one GPU per local rank
(the model and every batch on ``cuda:LOCAL_RANK``), anything else gloo on CPU.
"""

from __future__ import annotations

import os
from dataclasses import replace
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler

from gradsift.lab.comm import make_hook
from gradsift.lab.data import loader
from gradsift.lab.training import Setup, TrainConfig, make_optimizer, make_scheduler

__all__ = ["init_process_group", "rank_device", "ddp_setup", "fsdp_setup"]


def rank_device(device: str) -> str:
    """This rank's device: ``cuda:LOCAL_RANK`` for ``cuda``, else ``device``."""
    if torch.device(device).type != "cuda":
        return device
    return f"cuda:{int(os.environ.get('LOCAL_RANK', os.environ.get('RANK', '0')))}"


def init_process_group(rank: int, world: int, device: str, timeout_s: float = 120.0) -> None:
    """NCCL for a CUDA device, gloo otherwise; ``MASTER_ADDR/PORT`` from the env."""
    backend = "nccl" if torch.device(device).type == "cuda" else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(torch.device(rank_device(device)))
    dist.init_process_group(
        backend, rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s)
    )


def ddp_setup(model: torch.nn.Module, train_set, cfg: TrainConfig, rank: int, world: int):
    """``model`` on this rank's device inside DDP with ``cfg.comm`` (default: the top-k
    hook when ``cfg`` is sparse), SGD (the hook does the top-k; with DGC's recipe it
    also keeps the momentum), the schedule and a distributed sampler."""
    device = rank_device(cfg.device)
    model.to(device).train()
    on_cuda = torch.device(device).type == "cuda"
    ddp = DistributedDataParallel(model, device_ids=[torch.device(device)] if on_cuda else None)
    sampler = DistributedSampler(
        train_set, num_replicas=world, rank=rank, shuffle=True, seed=cfg.seed
    )
    data = loader(train_set, batch_size=cfg.batch_size, sampler=sampler)
    comm = cfg.comm or ("topk" if cfg.sparse else "allreduce")
    state, hook, momentum = make_hook(
        comm,
        density=cfg.density,
        k=cfg.k,
        error_feedback=cfg.error_feedback,
        momentum=cfg.momentum,
        iterations_per_epoch=len(data),
        params=list(model.parameters()),
    )
    if hook is not None:
        ddp.register_comm_hook(state, hook)
    opt = make_optimizer(model, replace(cfg, momentum=momentum), topk=False)
    return Setup(model, ddp, opt, make_scheduler(opt, cfg), data, device, rank, world, state)


def fsdp_setup(model: torch.nn.Module, train_set, cfg: TrainConfig, rank: int, world: int):
    """``model`` sharded with FSDP2 over a 1-D mesh of the ``world`` ranks (every module
    holding parameters, then the root, ``fully_shard``), SGD wrapped in ``TopK`` when
    ``cfg`` is sparse (the selection is global across the shards,
    ``gradsift.optim.sharded``), the schedule and a distributed sampler. Evaluation
    runs on every rank (FSDP gathers the weights for each forward)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    device = rank_device(cfg.device)
    model.to(device).train()
    mesh = init_device_mesh(torch.device(device).type, (world,))
    for module in list(model.modules())[1:]:
        if any(True for _ in module.parameters(recurse=False)):
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)
    sampler = DistributedSampler(
        train_set, num_replicas=world, rank=rank, shuffle=True, seed=cfg.seed
    )
    data = loader(train_set, batch_size=cfg.batch_size, sampler=sampler)
    opt = make_optimizer(model, cfg)
    setup = Setup(model, model, opt, make_scheduler(opt, cfg), data, device, rank, world)
    setup.eval_all_ranks = True
    return setup
