"""Checkpoint and resume of a training run: model, optimizer (with TopK's residuals),
LR schedule, DDP hook state, RNG and data-order state, history.

One file, ``DIR/checkpoint.pt``, written atomically by rank 0 after every epoch, with
the run's key (``RunSpec.key``): a checkpoint of another run is refused. Each rank's
own state (its hook residuals, its RNGs: the CPU's and, for a run on a CUDA device,
that device's; its loader's shuffle generator) is gathered into it, so the file is
always one consistent snapshot of every rank, and a resumed run continues bit for bit
on CPU: on one or two ranks, and with the top-k hook on any number. From three ranks,
a run whose DDP all-reduces bucket by bucket (``--comm allreduce``, ``fp16``,
``powersgd``, and the top-k hook's dense warm-up) may differ in the last bits after a
resume: a fresh DDP lays its first step's buckets out otherwise than the rebuilt
layout of the run it resumes, and the order in which gloo sums an element over three
or more ranks depends on the element's position. The top-k hook reduces one vector in
the parameters' order, whatever the buckets.
"""

from __future__ import annotations

import io
import logging
from pathlib import Path

import torch
import torch.distributed as dist

from gradsift.lab.atomic import atomic_write_bytes

__all__ = ["save", "restore", "FILENAME"]

log = logging.getLogger(__name__)

FILENAME = "checkpoint.pt"


def _cuda(setup) -> torch.device | None:
    """The run's CUDA device, whose generator (dropout, random draws on the GPU) is
    saved beside the CPU's; None for a run on the CPU."""
    device = torch.device(setup.device)
    return device if device.type == "cuda" else None


def _rank_state(setup) -> dict:
    gen = getattr(setup.data, "generator", None)
    cuda = _cuda(setup)
    return {
        "rng": torch.get_rng_state(),
        "cuda_rng": None if cuda is None else torch.cuda.get_rng_state(cuda),
        "loader": None if gen is None else gen.get_state(),
        "hook": None if setup.hook_state is None else setup.hook_state.state_dict(),
    }


def save(directory, setup, epoch: int, history: list, seconds: float) -> None:
    """Write the checkpoint after ``epoch`` epochs (a collective when ``world > 1``)."""
    ranks = [_rank_state(setup)]
    if setup.world > 1:
        ranks = [None] * setup.world if setup.rank == 0 else None
        dist.gather_object(_rank_state(setup), ranks, dst=0)
    if setup.rank != 0:
        return
    payload = {
        "epoch": epoch,
        "run": setup.run,
        "world": setup.world,
        "model": setup.model.state_dict(),
        "optimizer": setup.optimizer.state_dict(),
        "scheduler": None if setup.scheduler is None else setup.scheduler.state_dict(),
        "history": history,
        "seconds": seconds,
        "ranks": ranks,
    }
    buf = io.BytesIO()
    torch.save(payload, buf)
    atomic_write_bytes(Path(directory) / FILENAME, buf.getvalue())
    log.info("checkpoint after epoch %d in %s", epoch, directory)


def restore(directory, setup) -> dict | None:
    """Load the checkpoint into ``setup`` if there is one; return its payload."""
    path = Path(directory) / FILENAME
    if not path.exists():
        return None
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file gets the same message
        raise ValueError(f"cannot read checkpoint {path}: {exc}") from None
    if not isinstance(payload, dict) or not {"world", "model", "ranks"} <= payload.keys():
        raise ValueError(f"{path} is not a gradsift checkpoint: give this run its own --checkpoint")
    if payload["world"] != setup.world:
        raise ValueError(
            f"checkpoint {path} was written by {payload['world']} processes, "
            f"this run has {setup.world}"
        )
    run = payload.get("run")
    if None not in (run, setup.run) and run != setup.run:
        raise ValueError(
            f"checkpoint {path} is of another run ({run}), not of this one ({setup.run}): "
            "give this run its own --checkpoint directory"
        )
    try:
        setup.model.load_state_dict(payload["model"])
        setup.optimizer.load_state_dict(payload["optimizer"])
        if setup.scheduler is not None:
            setup.scheduler.load_state_dict(payload["scheduler"])
    except (RuntimeError, KeyError, ValueError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ValueError(f"checkpoint {path} does not fit this run: {first}") from None
    own = payload["ranks"][setup.rank]
    torch.set_rng_state(own["rng"])
    cuda = _cuda(setup)
    if cuda is not None and own.get("cuda_rng") is not None:  # not from a CPU run
        torch.cuda.set_rng_state(own["cuda_rng"], cuda)
    if own["loader"] is not None:
        setup.data.generator.set_state(own["loader"])
    if setup.hook_state is not None:
        setup.hook_state.load_state_dict(own["hook"])
    log.info("resumed after epoch %d from %s", payload["epoch"], path)
    return payload
