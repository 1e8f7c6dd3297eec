"""``gradsift bench ddp``: two gloo processes, step time and bytes per step of the
top-k hook against DDP's allreduce, through the one training loop (``fit``)."""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

from gradsift.distributed import TopKHookState, topk_hook
from gradsift.lab.launch import free_port
from gradsift.lab.models import build_model
from gradsift.lab.tables import Column
from gradsift.lab.training import fit

__all__ = ["bench_ddp", "COLUMNS"]

_WARMUP = 3  # steps not timed: the hook's dense start and DDP's bucket rebuild


def _kib(key):
    return lambda r: None if r[key] is None else r[key] / 1024


COLUMNS = [
    Column(lambda r: "allreduce" if r["density"] is None else f"top-k {r['density']:g}", "hook"),
    Column("step_ms", "step ms", ".1f"),
    Column("time_over_allreduce", "time/allreduce", ".2f"),
    Column(_kib("bytes_sent_per_step"), "KiB sent/step", ".1f"),
    Column(_kib("bytes_dense_per_step"), "KiB dense/step", ".1f"),
    Column(lambda r: r.get("compression", 1.0), "dense/sent", ".1f"),
]


def _timed_run(model_name, density, steps, batch, rank) -> dict:
    torch.manual_seed(0)
    ddp = DistributedDataParallel(build_model(model_name))
    state = None
    if density is not None:
        state = TopKHookState(density=density)
        ddp.register_comm_hook(state, topk_hook)
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(batch, 3, 32, 32, generator=gen)
    y = torch.randint(0, 10, (batch,), generator=gen)
    data = DataLoader(TensorDataset(x.repeat(steps, 1, 1, 1), y.repeat(steps)), batch_size=batch)
    stamps = []

    def on_step():  # a barrier per step: every rank's step is timed alike
        dist.barrier()
        stamps.append(time.perf_counter())
        if state is not None and len(stamps) == _WARMUP:  # count compressed steps only
            state.bytes_sent = state.bytes_dense = 0

    dist.barrier()
    start = time.perf_counter()
    fit(ddp, torch.optim.SGD(ddp.parameters(), lr=0.01), data, epochs=1, on_step=on_step)
    times = [b - a for a, b in zip([start, *stamps], stamps)][_WARMUP:]
    counted = len(times)
    return {
        "density": density,
        "step_ms": 1e3 * statistics.median(times),
        "bytes_sent_per_step": state.bytes_sent / counted if state else None,
        "bytes_dense_per_step": state.bytes_dense / counted if state else None,
    }


def _job(rank, world, port, model_name, densities, steps, batch, queue) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=300))
    torch.set_num_threads(1)  # two processes share the machine's cores
    rows = [_timed_run(model_name, d, steps, batch, rank) for d in [None, *densities]]
    if rank == 0:
        queue.put(rows)
    dist.destroy_process_group()


def bench_ddp(densities=(0.01, 0.001), steps: int = 13, batch: int = 32, model="resnet20"):
    """2 gloo processes: median step time after the warm-up, bytes per step."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    args = (2, port, model, densities, steps, batch, queue)
    procs = [ctx.Process(target=_job, args=(r, *args)) for r in range(2)]
    for p in procs:
        p.start()
    rows = queue.get(timeout=900)
    for p in procs:
        p.join()
    base = rows[0]["step_ms"]
    for r in rows:
        r["time_over_allreduce"] = r["step_ms"] / base
        if r["bytes_sent_per_step"]:
            r["compression"] = r["bytes_dense_per_step"] / r["bytes_sent_per_step"]
    return rows
