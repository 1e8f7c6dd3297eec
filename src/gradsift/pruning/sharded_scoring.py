"""Scoring a sharded model (FSDP2: ``DTensor`` parameters) on its shards.

``gradsift.score`` (``registry.run_criterion``) sends a model whose parameters are
``DTensor`` s here (``is_sharded_model``, the one test): the criterion's ``sharded``
form (``Method.sharded``) runs on the caller's model itself, since a sharded model
cannot be deep-copied into one process, and returns ``DTensor`` scores laid out like
the parameters (each rank computes its own rows). ``preserved`` puts back what the
scoring changes (weights, buffers, train/eval modes, ``requires_grad``, ``.grad``),
so the model is exactly as it was, at the cost of one copy of the local shards and
buffers while scoring.

Gradients of a sharded model arrive through FSDP's reduce-scatter, which averages
over ranks; an average of three equal values is not always that value in floating
point (``(g + g + g) / 3 != g`` for about 15% of float32 entries).
``rank0_gradients`` makes the reduction an exact sum instead (FSDP's gradient divide
factor 1, sum-only collectives, restored afterwards) in which only global rank 0's
loss counts (``share()``: 1 there, 0 on the others, which still run the forward and
backward FSDP's collectives need): every rank then holds its rows of exactly rank
0's gradient, the single-process gradient of the same batch.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager

import torch
from torch import nn

from gradsift.select.dtensor import is_sharded

__all__ = ["is_sharded_model", "like", "local_rows", "preserved", "rank0_gradients", "share"]

# where FSDP2's module class lives (public from torch 2.6 on), looked up in
# sys.modules: a model can only hold one once its module was imported
_FSDP_MODULES = ("torch.distributed.fsdp", "torch.distributed._composable.fsdp")


def is_sharded_model(model: nn.Module) -> bool:
    """Whether ``model``'s parameters are ``DTensor`` s (all or none: a mix raises).
    An FSDP2 module whose parameters a forward left unsharded (one without backward,
    or ``reshard_after_forward=False``) is resharded first: its parameters are its
    ``DTensor`` shards again, not FSDP's temporary full tensors."""
    fsdp = [sys.modules.get(name) for name in _FSDP_MODULES]
    kinds = tuple(m.FSDPModule for m in fsdp if m is not None and hasattr(m, "FSDPModule"))
    for m in model.modules() if kinds else ():
        if isinstance(m, kinds):
            m.reshard()
    return is_sharded(list(model.parameters()))


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``t``: its local shard for a ``DTensor``, else ``t``."""
    return t.to_local() if hasattr(t, "to_local") else t


def like(part: torch.Tensor, p) -> torch.Tensor:
    """``part`` (this rank's rows) as a ``DTensor`` laid out like ``p``."""
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(
        part, p.device_mesh, p.placements, run_check=False, shape=p.shape, stride=p.stride()
    )


def local_rows(full: torch.Tensor, p) -> torch.Tensor:
    """The rows of the full tensor ``full`` that this rank holds of ``p``, as a
    ``DTensor`` laid out like ``p`` (no communication)."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
    index = tuple(slice(o, o + n) for o, n in zip(offset, shape))
    return like(full[index].to(local(p).device).contiguous(), p)


def share() -> float:
    """The weight of this rank's loss under ``rank0_gradients``: 1 on rank 0, else 0."""
    import torch.distributed as dist

    return 1.0 if dist.get_rank() == 0 else 0.0


def _fsdp_modules(model: nn.Module) -> list:
    return [m for m in model.modules() if hasattr(m, "set_gradient_divide_factor")]


@contextmanager
def rank0_gradients(model: nn.Module):
    """FSDP's gradient reduction as an exact sum while inside (see the module doc)."""
    groups = [g for m in _fsdp_modules(model) for g in m._get_fsdp_state()._fsdp_param_groups]
    saved = [(g.gradient_divide_factor, g.force_sum_reduction_for_comms) for g in groups]
    for m in _fsdp_modules(model):
        m.set_gradient_divide_factor(1.0)
        m.set_force_sum_reduction_for_comms(True)
    try:
        yield
    finally:
        for g, (factor, force) in zip(groups, saved):
            g.gradient_divide_factor, g.force_sum_reduction_for_comms = factor, force


@contextmanager
def preserved(model: nn.Module):
    """Put back the weights, buffers, modes, ``requires_grad`` flags and ``.grad`` of
    ``model`` on exit; ``.grad`` is None inside (scorers read fresh gradients)."""
    params = list(model.parameters())
    modes = [m.training for m in model.modules()]
    flags = [p.requires_grad for p in params]
    grads = [p.grad for p in params]
    with torch.no_grad():
        weights = [local(p).clone() for p in params]
        buffers = [(b, b.clone()) for b in model.buffers()]
    for p in params:
        p.grad = None
    try:
        yield
    finally:
        with torch.no_grad():
            for p, w in zip(params, weights):
                local(p).copy_(w)
            for b, saved in buffers:
                b.copy_(saved)
        for p, flag, g in zip(params, flags, grads):
            p.requires_grad_(flag)
            p.grad = g
        for m, mode in zip(model.modules(), modes):
            m.training = mode
