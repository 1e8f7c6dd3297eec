"""Where the coordinates of ``DTensor`` parameters (FSDP2 shards) sit in the global
order of the unsharded model: what ``gradsift.select.sharded`` needs to select across
ranks, shared by sparse updates (``gradsift.optim.sharded``) and pruning
(``gradsift.pruning.sharded``).

The global order numbers the coordinates as in the unsharded model: the tensors in
the order given, each full tensor row-major. A ``Shard(0)`` tensor's local rows are
one contiguous range of that order (start = base of the tensor + first row times the
row length); a tensor with no ``Shard`` placement (``Replicate`` everywhere) is whole
on every rank and is counted once, by the selection group's first rank.
"""

from __future__ import annotations

import math
import sys

__all__ = ["dtensor_layout", "dtensor_type", "is_sharded"]


def dtensor_type():
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch without distributed
        return None
    return DTensor


def is_sharded(params) -> bool:
    """Whether ``params`` are ``DTensor`` s (all or none: a mix raises). Imports
    nothing: a ``DTensor`` exists only once ``torch.distributed.tensor`` is loaded
    (importing it costs some 40 MB of resident memory)."""
    loaded = sys.modules.get("torch.distributed.tensor")
    dt = getattr(loaded, "DTensor", None)
    flags = [dt is not None and isinstance(p, dt) for p in params]
    if any(flags) and not all(flags):
        raise ValueError(
            "params mix DTensor (sharded) and plain tensors: wrap every trained module "
            "with fully_shard, or none"
        )
    return bool(flags) and all(flags)


def dtensor_layout(params) -> tuple[object, list[tuple[int, int, bool]]]:
    """The selection group and, per parameter, ``(global start, local numel,
    replicated)`` in the global order of the module doc."""
    from torch.distributed.tensor import Replicate, Shard

    mesh, shard_dim, out, base = params[0].device_mesh, None, [], 0
    for p in params:
        if p.device_mesh != mesh:
            raise ValueError("every sharded parameter must live on the same device mesh")
        shards = [i for i, pl in enumerate(p.placements) if isinstance(pl, Shard)]
        others_ok = all(isinstance(pl, Replicate | Shard) for pl in p.placements)
        if len(shards) > 1 or not others_ok or any(p.placements[i].dim != 0 for i in shards):
            raise ValueError(
                f"parameter placements {p.placements} are not supported: Shard(0) on one "
                "mesh dimension and Replicate on the others (FSDP2, HSDP), or Replicate"
            )
        local = p.to_local()
        if shards:
            shard_dim = shards[0] if shard_dim is None else shard_dim
            if shards[0] != shard_dim:
                raise ValueError("every parameter must be sharded along the same mesh dimension")
            row = math.prod(p.shape[1:])  # p[0] on a DTensor would communicate
            first = _first_row(p)
            out.append((base + first * row, local.numel(), False))
        else:
            out.append((base, local.numel(), True))
        base += p.numel()
    group = mesh.get_group(shard_dim if shard_dim is not None else 0)
    return group, out


def _first_row(p) -> int:
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    _, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
    return int(offset[0]) if offset else 0
