"""``gradsift bench ddp [--bandwidth RATE]``: two gloo processes, the step time and
bytes per step of every way to communicate gradients, through the one training loop
(``fit``): DDP's allreduce, torch's ``fp16_compress_hook`` and PowerSGD (rank 4),
gradsift's top-k with the old wire format (int64 + float32) and the compact one
(``encoding="auto"``, bfloat16 values); and the same step in one process with no
communication at all. With ``--bandwidth`` it runs in a network namespace whose
loopback is shaped (``gradsift.lab.shaping``); bytes are then counted on that
loopback, every byte the ranks exchanged, divided by the ranks.
"""

from __future__ import annotations

import logging
import os
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

from gradsift.lab.atomic import atomic_write_json, read_json
from gradsift.lab.comm import make_hook
from gradsift.lab.data import loader
from gradsift.lab.launch import RankFailedError, free_cycles, free_port, run_processes
from gradsift.lab.models import build_model, list_models
from gradsift.lab.shaping import ENV, loopback_bytes, run_shaped
from gradsift.lab.tables import Column, columns
from gradsift.lab.training import fit

__all__ = ["bench_ddp", "COLUMNS", "WARMUP_STEPS"]

log = logging.getLogger(__name__)

WARMUP_STEPS = 3  # steps not timed: dense starts, DDP's bucket rebuild, PowerSGD's start

VARIANTS = {  # name -> make_hook arguments
    "allreduce": {"comm": "allreduce"},
    "fp16_compress_hook": {"comm": "fp16"},
    "PowerSGD rank 4": {"comm": "powersgd"},
    "top-k 0.01 int64+fp32": {"comm": "topk", "density": 0.01, "encoding": "int64"},
    "top-k 0.01 compact": {"comm": "topk", "density": 0.01, "value_dtype": torch.bfloat16},
    "top-k 0.001 int64+fp32": {"comm": "topk", "density": 0.001, "encoding": "int64"},
    "top-k 0.001 compact": {"comm": "topk", "density": 0.001, "value_dtype": torch.bfloat16},
}


def _mib(r):
    return None if r.get("bytes_per_step") is None else r["bytes_per_step"] / 2**20


COLUMNS = [
    *columns(
        """
        hook                 hook
        step_ms              step ms              .1f
        time_over_allreduce  time/allreduce       .2f
        """
    ),
    Column(_mib, "MiB/step/rank", ".3f"),
    *columns(
        """
        bytes_per_coordinate  bytes/sent coordinate  .2f
        error                 error
        """
    ),
]


def _batches(steps: int, batch: int, rank: int) -> DataLoader:
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(batch, 3, 32, 32, generator=gen)
    y = torch.randint(0, 10, (batch,), generator=gen)
    return loader(TensorDataset(x.repeat(steps, 1, 1, 1), y.repeat(steps)), batch_size=batch)


def _timed(forward, model, data, on_step_extra=None, *, barrier=True) -> list[float]:
    stamps = []

    def on_step():
        if barrier:
            dist.barrier()  # every rank's step is timed alike
        stamps.append(time.perf_counter())
        if on_step_extra is not None:
            on_step_extra(len(stamps))

    start = time.perf_counter()
    fit(forward, torch.optim.SGD(model.parameters(), lr=0.01), data, epochs=1, on_step=on_step)
    return [b - a for a, b in zip([start, *stamps], stamps)][WARMUP_STEPS:]


def _run_variant(name, model_name, steps, batch, rank, world) -> dict:
    torch.manual_seed(0)
    model = build_model(model_name)
    ddp = DistributedDataParallel(model)
    state, hook, _ = make_hook(**VARIANTS[name])
    if hook is not None:
        ddp.register_comm_hook(state, hook)
    marks = {}

    def mark(step):
        if step == WARMUP_STEPS:
            marks["lo"], marks["hook"] = loopback_bytes(), getattr(state, "bytes_sent", 0)

    times = _timed(ddp, model, _batches(steps, batch, rank), mark)
    counted = len(times)
    row = {"hook": name, "step_ms": 1e3 * statistics.median(times)}
    row["bytes_per_step"] = (loopback_bytes() - marks["lo"]) / counted / world
    if hasattr(state, "bytes_sent"):  # top-k: its own count of what it sent
        n = sum(p.numel() for p in model.parameters())
        sent = (state.bytes_sent - marks["hook"]) / counted
        row["bytes_per_coordinate"] = sent / state.budget.resolve(n)
    return row


def _no_comm(model_name, steps, batch) -> dict:
    """The same steps in this process without DDP, on one thread as each rank (a
    process of its own would cost a start of Python and torch, and nothing here
    talks to another process that could take it down); the caller's thread count and
    random state are left as they were."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = build_model(model_name)
            times = _timed(model, model, _batches(steps, batch, 0), barrier=False)
    finally:
        torch.set_num_threads(threads)
    return {"hook": "one process, no communication", "step_ms": 1e3 * statistics.median(times)}


def _job(rank, world, port, model_name, name, steps, batch, out) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=300))
    torch.set_num_threads(1)  # two processes share the machine's cores
    try:
        row = _run_variant(name, model_name, steps, batch, rank, world)
    except Exception as exc:  # noqa: BLE001 - a hook that fails is a result to report
        row = {"hook": name, "error": f"{type(exc).__name__}: {exc}"[:160]}
    free_cycles()
    if rank == 0:
        atomic_write_json(out, row)
    # no rank tears its group down while the other still works (see launch.run_rank)
    dist.barrier()
    dist.destroy_process_group()


def _isolated(fn, args: tuple, nproc: int, name: str) -> dict:
    """One variant's row from its own processes: a rank that dies natively (a hook
    aborting in gloo, say) then becomes that variant's ``error`` instead of ending
    the whole benchmark."""
    with tempfile.TemporaryDirectory(prefix="gradsift-bench-ddp-") as tmp:
        out = Path(tmp) / "row.json"
        try:
            run_processes(fn, (*args, str(out)), nproc)
        except RankFailedError as exc:
            if not out.exists():
                return {"hook": name, "error": str(exc)}
            # rank 0 writes the row once every timed step's collectives are done: a
            # rank that died after that died tearing down (torch's gloo teardown
            # aborts now and then, "terminate called without an active exception")
            log.warning("%s: %s after the row was measured; the row is kept", name, exc)
            return {**read_json(str(out)), "teardown_error": str(exc)}
        return read_json(str(out))


def _two_ranks(model, variants, steps, batch, job=None) -> list[dict]:
    """Each variant's row from its own pair of ranks (``job(rank, world, port, model,
    name, steps, batch, out)``, ``_job`` by default), then the no-communication row
    from this process."""
    job = _job if job is None else job
    if model not in list_models():  # one clear error, not one per variant
        raise ValueError(f"model must be one of {list_models()}, got {model!r}")
    rows = [_isolated(job, (2, free_port(), model, name, steps, batch), 2, name)
            for name in variants]  # fmt: skip
    rows.append(_no_comm(model, steps, batch))
    base = next((r["step_ms"] for r in rows if r["hook"] == "allreduce" and "step_ms" in r), None)
    for r in rows:
        if base and "step_ms" in r:
            r["time_over_allreduce"] = r["step_ms"] / base
    return rows


def bench_ddp(
    bandwidth: str | None = None,
    model: str = "resnet18",
    steps: int = 13,
    batch: int = 8,
    variants=tuple(VARIANTS),
) -> list[dict]:
    """Rows per variant (see the module docstring); ``bandwidth`` like ``1gbit``."""
    if bandwidth is not None and os.environ.get(ENV) != bandwidth:
        kwargs = {"bandwidth": bandwidth, "model": model, "steps": steps, "batch": batch}
        rows = run_shaped(
            bandwidth, f"{__name__}:bench_ddp", {**kwargs, "variants": list(variants)}
        )
        return [{**r, "bandwidth": bandwidth} for r in rows]
    return _two_ranks(model, variants, steps, batch)
