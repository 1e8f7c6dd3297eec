"""``gradsift bench sharded``: the bytes the sharded selection sends per rank per
selection (``gradsift.select.sharded``, what ``TopK`` on an FSDP2 model and sharded
pruning run once per step or round) against the size of the gradient it selects from.

Each of ``world`` gloo ranks on this machine holds ``N / world`` float32 values and the
ranks select the global top-k; the collectives are counted as they are called: the
payload each rank contributes (``all_reduce``: its tensor; ``all_gather``: its part),
which is what ``gradsift.select.sharded.selection_bytes`` predicts. A ring all-reduce
puts about ``2 (world - 1) / world`` times its payload on the wire per rank. Bytes, not
time: the numbers do not depend on the machine or how busy it is.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist

from gradsift.lab.atomic import atomic_write_json, read_json
from gradsift.lab.tables import columns

__all__ = ["bench_sharded_bytes", "COLUMNS"]

COLUMNS = columns(
    """
    world            ranks                 d
    n                N                     d
    k                k                     d
    allreduce_bytes  all-reduce B/rank     d
    allgather_bytes  all-gather B/rank     d
    gradient_bytes   gradient B (float32)  d
    ratio            gradient/selection    .0f
    """
)


def bench_sharded_bytes(
    *, sizes=(10_000_000,), densities=(0.001, 0.1), world: int = 2, repeats: int = 1
) -> list[dict]:
    """One row per ``(N, density)``: bytes per rank of one selection (``repeats`` is
    accepted for the command line's sake: a count needs no repeat)."""
    from gradsift.lab.launch import free_port, run_processes

    with tempfile.TemporaryDirectory(prefix="gradsift-bench-sharded-") as tmp:
        out = str(Path(tmp) / "rows.json")
        args = (world, free_port(), tuple(sizes), tuple(densities), out)
        run_processes(_rank, args, world)
        return read_json(out)["rows"]


def _rank(rank: int, world: int, port: int, sizes, densities, out: str) -> None:
    from gradsift.budget import resolve_k
    from gradsift.lab.parallel import init_process_group
    from gradsift.select.sharded import sharded_topk_mask

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    init_process_group(rank, world, "cpu")
    try:
        rows = []
        for n in sizes:
            lengths = [n // world + (1 if r < n % world else 0) for r in range(world)]
            gen = torch.Generator().manual_seed(rank)
            x = torch.randn(lengths[rank], generator=gen)
            for density in densities:
                k = resolve_k(n, density=density)
                with _counted() as sent:
                    sharded_topk_mask(x, k, offset=sum(lengths[:rank]))
                total = sent["all_reduce"] + sent["all_gather"]
                rows.append(
                    dict(
                        world=world,
                        n=n,
                        k=k,
                        allreduce_bytes=sent["all_reduce"],
                        allgather_bytes=sent["all_gather"],
                        gradient_bytes=4 * n,
                        ratio=4 * n / total,
                    )
                )
        if rank == 0:
            atomic_write_json(out, {"rows": rows})
        dist.barrier()
    finally:
        dist.destroy_process_group()


@contextmanager
def _counted():
    """Count the payload this rank hands to ``all_reduce`` and ``all_gather``."""
    sent = {"all_reduce": 0, "all_gather": 0}
    saved = dist.all_reduce, dist.all_gather

    def all_reduce(tensor, *args, **kwargs):
        sent["all_reduce"] += tensor.numel() * tensor.element_size()
        return saved[0](tensor, *args, **kwargs)

    def all_gather(outputs, tensor, *args, **kwargs):
        sent["all_gather"] += tensor.numel() * tensor.element_size()
        return saved[1](outputs, tensor, *args, **kwargs)

    dist.all_reduce, dist.all_gather = all_reduce, all_gather
    try:
        yield sent
    finally:
        dist.all_reduce, dist.all_gather = saved
