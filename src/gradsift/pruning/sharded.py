"""Pruning at init on sharded models (FSDP2: ``DTensor`` parameters): global masks
chosen across the shards, installed in place, kept applied while training.

**Masks.** ``sharded_masks_from_scores`` is ``masks_from_scores`` with
``allocation="global"`` for ``DTensor`` scores (``Shard(0)`` on one mesh dimension and
``Replicate`` on the others, as FSDP2 and HSDP lay parameters out, or ``Replicate``
everywhere): the kept count ``gradsift.budget.kept_count`` over the global ``N``, the
same keys as there (``masks.fill_keys_``: the scores' dtype, at least float32,
weights pruned by ``previous`` at the lowest key), the top ones chosen across the mesh
by ``gradsift.select.sharded`` in the global order of the unsharded model (names in
order, each tensor row-major), so the masks equal the single-process ones, ties
included. No score is gathered. A ``Replicate`` score is ranked once, by the
selection group's first rank, which then broadcasts its mask (a byte per entry).

**Installing.** ``torch.nn.utils.prune``'s reparametrisation (``weight_orig`` times
``weight_mask`` in a forward pre-hook) replaces the parameter that FSDP manages, so
on a sharded model the masks are multiplied into the local shards instead
(``apply_sharded_masks_``, under ``torch.no_grad()``). Nothing then stops training
from reviving pruned weights: ``hold_masks(optimizer, model, masks)`` registers an
optimizer step pre-hook that zeroes their gradients, also those a closure makes
inside the step (so ``gradsift.TopK`` never spends its budget nor its residual on
them), and a post-hook that multiplies the masks into the weights again (momentum,
weight decay); its handle's ``remove()`` stops it.

**prune_at_init** (``prune_shards``, which ``gradsift.prune_at_init`` calls for a
sharded model): score on the shards (``gradsift.pruning.sharded_scoring``), select
globally, install; iterative rounds as single-process (``schedule``), each scoring the
model with the masks so far multiplied in. Layer allocations other than global,
``min_per_layer``, sanity variants and methods without a sharded form raise
``ValueError`` before any work. A sharded model keeps no mask buffers, so a second
``prune_at_init`` does not know the first one's masks (single-process pruning counts
them toward the target): prune once, with ``iterations`` for several rounds.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from gradsift.budget import kept_count
from gradsift.pruning.masks import check_sparsity, fill_keys_, key_dtype
from gradsift.pruning.params import original, prunable
from gradsift.pruning.registry import check_shardable, get_method, run_criterion
from gradsift.pruning.sampling import replayable
from gradsift.pruning.schedules import round_sparsities
from gradsift.pruning.sharded_scoring import like, local
from gradsift.select.dtensor import dtensor_layout
from gradsift.select.sharded import sharded_topk_mask

__all__ = [
    "MaskHold",
    "apply_sharded_masks_",
    "hold_masks",
    "prune_shards",
    "sharded_masks_from_scores",
]


@torch.no_grad()
def sharded_masks_from_scores(scores: dict, sparsity: float, *, previous=None) -> dict:
    """``{name: DTensor mask}`` (float 0/1, laid out like the scores) keeping the top
    ``1 - sparsity`` of ``scores`` globally (higher keeps); ``previous`` masks' zeros
    stay zero. Every rank calls it with the same names and ``sparsity``."""
    from torch.distributed.tensor import DTensor

    sparsity = check_sparsity(sparsity)
    names = list(scores)
    if not names or not all(isinstance(scores[n], DTensor) for n in names):
        raise TypeError("scores must be a non-empty dict of DTensor scores (sharded)")
    group, layout = dtensor_layout([scores[n] for n in names])
    first = dist.get_rank(group) == 0
    counted = [first or not rep for _, _, rep in layout]  # a Replicate score: once
    sizes = [n if c else 0 for (_, n, _), c in zip(layout, counted)]
    device = local(scores[names[0]]).device
    flat = torch.empty(sum(sizes), dtype=key_dtype(scores), device=device)
    # [weights alive, then per score: whether it holds a NaN], summed over the ranks
    counts, at = [0] * (1 + len(names)), 0
    for j, (name, size) in enumerate(zip(names, sizes)):
        if size:
            old = None if previous is None else local(previous[name])
            alive = fill_keys_(flat[at : at + size], local(scores[name]), old, nan_error=False)
            counts[0] += alive or 0
            counts[1 + j] = int(alive is None)
            at += size
    counts = torch.tensor(counts, dtype=torch.int64, device=device)
    dist.all_reduce(counts, group=group)
    nan = torch.nonzero(counts[1:]).flatten().tolist()
    if nan:  # on every rank, as the selection raises for its own input
        raise ValueError(f"scores[{names[nan[0]]!r}] contains NaN; cannot rank it")
    keep = min(int(counts[0]), kept_count(sum(scores[n].numel() for n in names), sparsity))
    segments = [(start, n) for (start, n, _), size in zip(layout, sizes) if size]
    if keep == 0:
        mask = torch.zeros(flat.numel(), dtype=torch.bool, device=device)
    else:
        mask = sharded_topk_mask(flat, keep, segments=segments, absolute=False, group=group)
    parts = _split(mask, [local(scores[n]) for n in names], sizes)
    _share_replicated_(parts, [rep for _, _, rep in layout], group)
    out = {}
    for name, part in zip(names, parts):
        out[name] = like(part.float(), scores[name])
    return out


def _split(mask: torch.Tensor, shards: list, sizes: list) -> list:
    """Each shard's part of ``mask`` (zeros where this rank did not count it)."""
    parts, at = [], 0
    for shard, size in zip(shards, sizes):
        if size:
            parts.append(mask[at : at + size].view(shard.shape))
        else:
            parts.append(torch.zeros(shard.shape, dtype=torch.bool, device=mask.device))
        at += size
    return parts


def _share_replicated_(parts: list, replicated: list, group) -> None:
    """The group's first rank's masks of the ``Replicate`` scores, on every rank."""
    rep = [i for i, r in enumerate(replicated) if r]
    if not rep:
        return
    shared = torch.cat([parts[i].reshape(-1) for i in rep]).to(torch.uint8)
    dist.broadcast(shared, group_src=0, group=group)
    at = 0
    for i in rep:
        n = parts[i].numel()
        parts[i] = shared[at : at + n].bool().view(parts[i].shape)
        at += n


@torch.no_grad()
def apply_sharded_masks_(model, masks: dict) -> None:
    """Multiply ``masks`` (``DTensor`` s like the weights) into ``model``'s local shards."""
    for name, (m, a) in prunable(model, list(masks)).items():
        w = local(original(m, a))
        w.mul_(local(masks[name]).to(w))


class MaskHold:
    """What ``hold_masks`` registered; ``remove()`` stops keeping the masks."""

    def __init__(self, handles: list):
        self.handles = handles

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def hold_masks(optimizer, model, masks: dict) -> MaskHold:
    """Keep ``masks`` applied to ``model`` while ``optimizer`` steps (see the module
    doc): before each step the pruned weights' gradients are zeroed, after it the
    weights are multiplied by the masks. Works for sharded and plain parameters;
    ``optimizer`` is any ``torch.optim.Optimizer``, ``gradsift.TopK`` included."""
    pairs = []
    for name, (m, a) in prunable(model, list(masks)).items():
        p = original(m, a)
        pairs.append((p, local(masks[name]).to(local(p))))

    @torch.no_grad()
    def zero_grads():
        for p, mask in pairs:
            if p.grad is not None:
                local(p.grad).mul_(mask)

    def zero_pruned_grads(opt, args, kwargs):
        zero_grads()
        # args: (optimizer, closure) where the closure is passed by position
        closure = kwargs["closure"] if "closure" in kwargs else args[1] if len(args) > 1 else None
        if closure is None:
            return None

        def masked():  # the gradients a closure makes inside the step: zeroed too
            loss = closure()
            zero_grads()
            return loss

        if "closure" in kwargs:
            return args, {**kwargs, "closure": masked}
        return (args[0], masked, *args[2:]), kwargs

    @torch.no_grad()
    def zero_pruned_weights(opt, args, kwargs):
        for p, mask in pairs:
            local(p).mul_(mask)

    return MaskHold(
        [
            optimizer.register_step_pre_hook(zero_pruned_grads),
            optimizer.register_step_post_hook(zero_pruned_weights),
        ]
    )


def prune_shards(
    model,
    method: str,
    sparsity: float,
    data=None,
    *,
    iterations: int = 1,
    schedule: str = "exponential",
    params=None,
    refused: dict | None = None,
    **options,
) -> dict:
    """``prune_at_init`` on a sharded model (module doc); the installed masks as
    ``DTensor`` s (float 0/1). ``refused``: ``prune_at_init``'s options that have no
    sharded form, by name; any set to other than its default raises."""
    check_shardable(get_method(method))
    for name, value in (refused or {}).items():
        if value not in (None, 0, False, "global"):
            raise ValueError(f"{name}={value!r} is not supported on a sharded model")
    check_sparsity(sparsity)
    targets = round_sparsities(sparsity, iterations, schedule)
    if sparsity == 0:
        targets = targets[:1]
    takes_sparsity = get_method(method).takes_sparsity
    data = replayable(data)
    prunable(model, params)  # names checked, coverage warned once
    masks = None
    for target in targets:
        extra = {"sparsity": target} if takes_sparsity else {}
        scores = run_criterion(
            model, method, data, params=params, warn=False, options={**options, **extra}
        )
        masks = sharded_masks_from_scores(scores, target, previous=masks)
        del scores
        apply_sharded_masks_(model, masks)
    return masks
