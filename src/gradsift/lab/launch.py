"""Starting data-parallel runs: ``gradsift train --nproc N`` starts N local processes;
under ``torchrun`` (which sets ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT``)
each process joins directly: ``torchrun --nproc-per-node 2 -m gradsift train ...``."""

from __future__ import annotations

import gc
import os
import socket
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from gradsift.lab import processes
from gradsift.lab.atomic import atomic_write_json, read_json
from gradsift.lab.parallel import init_process_group
from gradsift.lab.runs import run_one
from gradsift.lab.specs import RunSpec

__all__ = [
    "RankFailedError",
    "free_cycles",
    "free_port",
    "run_processes",
    "run_rank",
    "spawn",
    "under_torchrun",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_cycles() -> None:
    """Collect cyclic garbage before a process group is torn down: a
    ``DistributedDataParallel`` is kept alive by a reference cycle after its last
    use, and left to the interpreter's finalization its process group is destroyed
    with the interpreter half gone (a SIGABRT now and then, "terminate called
    without an active exception"; pytorch/pytorch#179291 describes the crash)."""
    gc.collect()


def under_torchrun() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ


def run_rank(
    spec: RunSpec, *, rank: int, world: int, checkpoint_dir=None, timeout_s: float = 120.0
) -> dict | None:
    """This process's rank of ``spec``; rank 0 returns the result record."""
    _share_cores(int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    init_process_group(rank, world, spec.train.device, timeout_s)
    try:
        record = run_one(spec, rank=rank, world=world, checkpoint_dir=checkpoint_dir)
        free_cycles()
        # no rank tears its group down while another is still working (rank 0
        # evaluates and writes after training): without this, a rank exiting early
        # aborted in 3 of 10 torchrun runs ("terminate called without an active
        # exception"); with it, 0 of 22
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return record if rank == 0 else None


def _share_cores(local_ranks: int) -> None:
    """Give each of the ``local_ranks`` processes on this machine its share of the
    cores, as torchrun does (it sets ``OMP_NUM_THREADS=1``), unless the user chose.

    Every spawned process otherwise starts as many threads as there are cores: two
    ranks on two cores made a digits MLP step 5x slower (DDP allreduce 17 ms instead of
    3.5 ms), which hid what communication costs.
    """
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_ranks))


def _worker(rank: int, world: int, port: int, spec: RunSpec, checkpoint_dir, out) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ["LOCAL_RANK"] = str(rank)
    record = run_rank(spec, rank=rank, world=world, checkpoint_dir=checkpoint_dir)
    if rank == 0:
        atomic_write_json(out, record)


def spawn(spec: RunSpec, nproc: int, *, checkpoint_dir=None) -> dict:
    """Run ``spec`` in ``nproc`` local processes; return rank 0's record.

    The record comes back through a file, not a pipe: a pipe that fills up would
    block rank 0 while this process waits for it to exit.
    """
    with tempfile.TemporaryDirectory(prefix="gradsift-spawn-") as tmp:
        out = Path(tmp) / "record.json"
        run_processes(_worker, (nproc, free_port(), spec, checkpoint_dir, str(out)), nproc)
        return read_json(out)


class RankFailedError(RuntimeError):
    """A rank of a data-parallel run raised or died; the message names it."""


def run_processes(fn, args: tuple, nproc: int) -> None:
    """``fn(rank, *args)`` in ``nproc`` new processes (``gradsift.lab.processes``),
    under this process's environment. When one fails, the others are stopped and
    ``RankFailedError`` says which rank and why, in one line."""
    import torch.multiprocessing as mp

    method = processes.context().get_start_method()
    try:
        mp.start_processes(
            _rank_in_environ, args=(dict(os.environ), fn, *args), nprocs=nproc, join=True,
            start_method=method,
        )  # fmt: skip
    except mp.ProcessRaisedException as exc:
        lines = [line for line in str(exc).splitlines() if line.strip()]
        raise RankFailedError(f"rank {exc.error_index} failed: {lines[-1].strip()}") from None
    except mp.ProcessExitedException as exc:
        how = exc.signal_name or f"exit code {exc.exit_code}"
        raise RankFailedError(f"rank {exc.error_index} died ({how})") from None


def _rank_in_environ(rank: int, environ: dict, fn, *args) -> None:
    processes.adopt_environ(environ)
    fn(rank, *args)
