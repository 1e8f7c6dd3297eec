"""Scores to masks, and masks into the model through ``torch.nn.utils.prune``.

Exactly ``round(sparsity * N)`` weights are removed: the kept set is an exact top-k
of the scores (``gradsift.select.topk_mask`` with ``absolute=False``, since signed
scores such as GraSP's must not be ranked by magnitude), ties broken toward the
lowest index in the concatenation of the layers in model order. There is no
``<=``-threshold over-pruning on ties. Under a layer-wise budget
(``gradsift.pruning.budgets``) the same top-k runs in each layer on that layer's
exact count.

Masks are monotone: weights pruned by an earlier mask are never revived.

Shuffling (Frankle, Dziugaite, Roy & Carbin, "Pruning Neural Networks at
Initialization: Why are We Missing the Mark?", ICLR 2021, arXiv:2009.08576) permutes
each layer's mask, keeping its density: the sanity check that asks whether a method
learned *which* weights matter or only *how many* per layer.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils import prune

from gradsift.checks import check_float, check_int, has_nan
from gradsift.pruning.budgets import check_budget, layer_counts
from gradsift.pruning.params import mask_of, original, owners, prunable
from gradsift.pruning.shared import refresh_readers_
from gradsift.select import topk_indices, topk_mask

__all__ = ["masks_from_scores", "apply_masks_", "shuffle_masks", "check_sparsity"]


def check_sparsity(sparsity: float) -> float:
    return check_float("sparsity", sparsity, "[0, 1)")


def masks_from_scores(
    scores: dict[str, torch.Tensor],
    sparsity: float,
    *,
    budget=None,
    scope: str | None = None,
    previous: dict[str, torch.Tensor] | None = None,
    min_per_layer: int = 0,
    workspace: dict | None = None,
) -> dict[str, torch.Tensor]:
    """Binary masks (same dtype as the weight would use: float) keeping the top scores.

    Args:
        scores: ``{name: score}``; higher keeps.
        sparsity: fraction removed, in [0, 1); ``round(sparsity * N)`` of the ``N``
            scored weights are removed.
        budget: ``"global"`` (default: one ranking over all layers), ``"uniform"``,
            ``"er"``, ``"erk"``, ``"uniform+dense-first"`` or a callable: fixed
            per-layer counts, ranked within each layer (``gradsift.pruning.budgets``).
        scope: the older name: ``"global"``, or ``"layer"`` for ``budget="uniform"``.
        previous: masks already installed; their zeros stay zero (the count removed
            is then at least what they removed).
        min_per_layer: keep at least this many weights in every layer (the best
            scored ones), guarding against layer collapse; the total stays exact.
        workspace: a dict reused across calls (iterative pruning) to hold the flat
            score buffer: a fresh buffer of hundreds of MB page-faults on every call.
    """
    check_sparsity(sparsity)
    budget = check_budget(budget, scope)
    min_per_layer = check_int("min_per_layer", min_per_layer, minimum=0)
    names = list(scores)
    for n in names:
        if has_nan(scores[n]):
            raise ValueError(f"scores[{n!r}] contains NaN; cannot rank it")
    keys = {n: _alive_keys(scores[n], None if previous is None else previous.get(n)) for n in names}
    if budget != "global":
        shapes = {n: scores[n].shape for n in names}
        alive = {n: _alive(keys[n]) for n in names}
        counts = layer_counts(shapes, sparsity, budget, caps=alive, floor=min_per_layer)
        return {n: _keep_top(keys[n], counts[n]).view_as(scores[n]) for n in names}
    flat = torch.cat([keys[n].reshape(-1) for n in names], out=_buffer(workspace, keys, names))
    keep = _kept_count(flat, sparsity)
    if min_per_layer:
        flat = _reserve(flat, [keys[n].numel() for n in names], min_per_layer, keep)
    mask = _keep_top(flat, keep)
    out, offset = {}, 0
    for n in names:
        size = scores[n].numel()
        out[n] = mask[offset : offset + size].view_as(scores[n])
        offset += size
    return out


def _buffer(workspace: dict | None, keys: dict, names: list) -> torch.Tensor | None:
    if workspace is None:
        return None
    n = sum(keys[name].numel() for name in names)
    first = keys[names[0]]
    buf = workspace.get("flat")
    if buf is None or buf.numel() != n or buf.device != first.device:
        buf = workspace["flat"] = torch.empty(n, dtype=first.dtype, device=first.device)
    return buf


def _alive_keys(score: torch.Tensor, previous: torch.Tensor | None) -> torch.Tensor:
    key = score.detach().reshape(-1).to(torch.float64, copy=True)
    if previous is not None:
        key.masked_fill_(previous.reshape(-1).to(key.device) == 0, -torch.inf)
    return key


def _alive(keys: torch.Tensor) -> int:
    return int(torch.count_nonzero(keys > -torch.inf))


def _kept_count(keys: torch.Tensor, sparsity: float) -> int:
    n = keys.numel()
    return min(_alive(keys), n - round(sparsity * n))


def _keep_top(keys: torch.Tensor, keep: int) -> torch.Tensor:
    if keep == 0:
        return torch.zeros(keys.numel(), dtype=torch.float32, device=keys.device)
    return topk_mask(keys.reshape(-1), keep, absolute=False).float()


def _reserve(flat: torch.Tensor, sizes: list[int], per_layer: int, keep: int) -> torch.Tensor:
    """Raise each layer's best ``per_layer`` live scores to +inf so they are kept."""
    reserved = 0
    out = flat.clone()
    offset = 0
    for size in sizes:
        part = out[offset : offset + size]
        alive = _alive(part)
        m = min(per_layer, alive)
        if m:
            part[topk_indices(part, m, absolute=False)] = torch.inf
        reserved += m
        offset += size
    if reserved > keep:
        raise ValueError(
            f"min_per_layer={per_layer} needs {reserved} weights but sparsity keeps only {keep}"
        )
    return out


def apply_masks_(
    model: nn.Module, masks: dict[str, torch.Tensor], *, replace: bool = False
) -> None:
    """Install ``masks`` with ``torch.nn.utils.prune.custom_from_mask``.

    A layer that is already pruned gets its ``*_mask`` buffer updated in place (one
    forward pre-hook per weight, never a growing chain of pruning containers): ANDed
    with the new mask, so pruned weights stay pruned, or overwritten with
    ``replace=True`` (a shuffled mask moves the kept positions). A tied weight is
    masked in every module that holds it, and a parent that reads a pruned child's
    weight directly (``nn.MultiheadAttention``) refreshes it (``pruning.shared``).
    """
    targets = prunable(model, list(masks))
    holders = owners(model)
    for name, (module, attr) in targets.items():
        for m, a in holders[id(original(module, attr))]:  # every holder of a tied weight
            _install(m, a, masks[name], replace)
    refresh_readers_(model)


def _install(module: nn.Module, attr: str, mask: torch.Tensor, replace: bool) -> None:
    existing = mask_of(module, attr)
    if existing is None:
        prune.custom_from_mask(module, attr, mask.to(getattr(module, attr).device))
    else:
        with torch.no_grad():
            if replace:
                existing.copy_(mask)
            else:
                existing.mul_(mask.to(existing))
    # recompute ``weight = weight_orig * weight_mask`` without autograd history, so
    # that the model deep-copies and pickles (the pre-hook redoes it every forward)
    with torch.no_grad():
        setattr(module, attr, getattr(module, attr + "_orig") * mask_of(module, attr))


def shuffle_masks(
    masks: dict[str, torch.Tensor], *, generator: torch.Generator | None = None
) -> dict[str, torch.Tensor]:
    """Each layer's mask randomly permuted: same density per layer, random positions."""
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    out = {}
    for name, m in masks.items():
        perm = torch.randperm(m.numel(), generator=gen).to(m.device)
        out[name] = m.reshape(-1)[perm].view_as(m).clone()
    return out
