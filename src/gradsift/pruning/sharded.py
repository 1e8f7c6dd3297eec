"""Global pruning masks for sharded models (FSDP2, ``DTensor`` scores).

``sharded_masks_from_scores`` is ``masks_from_scores`` with ``budget="global"`` for
scores that are ``DTensor`` shards (``Shard(0)``, or ``Replicate``): the kept count
``N - round(sparsity * N)`` over the global ``N``, the scores ranked in float64 as
there, and the top ones chosen across the mesh by ``gradsift.select.sharded`` in the
global order of the unsharded model (names in order, each tensor row-major), so the
masks equal the single-process ones, ties included. No score is gathered.

Scores on shards: magnitude is ``|w|`` of each rank's shard, computed locally. Masks
come back as ``DTensor`` s like the scores (float 0/1); install them on the sharded
parameters by multiplication (``p.mul_(mask)`` under ``torch.no_grad()``) and keep
them applied after each step (``TopK``'s gradients or a post-step hook), since
``torch.nn.utils.prune``'s reparametrisation replaces the parameter FSDP manages.
"""

from __future__ import annotations

import torch

from gradsift.checks import check_float
from gradsift.select.dtensor import dtensor_layout
from gradsift.select.sharded import sharded_topk_mask

__all__ = ["sharded_masks_from_scores"]


@torch.no_grad()
def sharded_masks_from_scores(scores: dict, sparsity: float) -> dict:
    """``{name: DTensor mask}`` keeping the top ``1 - sparsity`` of ``scores`` globally
    (higher keeps); every rank calls it with the same names and ``sparsity``."""
    from torch.distributed.tensor import DTensor

    sparsity = check_float("sparsity", sparsity, "[0, 1)")
    names = list(scores)
    if not names or not all(isinstance(scores[n], DTensor) for n in names):
        raise TypeError("scores must be a non-empty dict of DTensor scores (sharded)")
    group, layout = dtensor_layout([scores[n] for n in names])
    if any(rep for _, _, rep in layout):
        raise ValueError("replicated scores are not supported here: shard them with Shard(0)")
    n = sum(scores[name].numel() for name in names)
    keep = n - round(sparsity * n)
    flat = torch.cat([scores[name].to_local().reshape(-1).to(torch.float64) for name in names])
    segments = [(start, count) for start, count, _ in layout]
    mask = sharded_topk_mask(flat, keep, segments=segments, absolute=False, group=group)
    out, at = {}, 0
    for name in names:
        s = scores[name]
        local = mask[at : at + s.to_local().numel()].view(s.to_local().shape).float()
        out[name] = DTensor.from_local(
            local, s.device_mesh, s.placements, run_check=False, shape=s.shape, stride=s.stride()
        )
        at += local.numel()
    return out
