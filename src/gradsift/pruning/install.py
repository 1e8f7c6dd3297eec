"""Masks into the model through ``torch.nn.utils.prune``.

A weight pruned for the first time gets a boolean mask buffer
(``gradsift.pruning.boolean_mask``); one pruned before keeps its buffer, updated in
place, so a model carries one pre-hook per weight however often it is pruned. A tied
weight is masked in every module that holds it, and a parent that reads a pruned
child's weight directly refreshes it (``gradsift.pruning.shared``).
"""

from __future__ import annotations

import torch
from torch import nn

from gradsift.pruning.boolean_mask import as_bool, install_, masked
from gradsift.pruning.keep_where import keep_where_
from gradsift.pruning.params import mask_of, original, owners, prunable
from gradsift.pruning.shared import refresh_readers_

__all__ = ["apply_masks_", "held_mask", "install_masks_"]


def apply_masks_(
    model: nn.Module, masks: dict[str, torch.Tensor], *, replace: bool = False
) -> None:
    """Install ``masks`` through ``torch.nn.utils.prune``: a ``*_mask`` buffer,
    ``*_orig`` and a forward pre-hook per weight.

    A new mask buffer is boolean (``gradsift.pruning.boolean_mask``: one byte per
    weight), a copy of the given mask (0/1 of any dtype, or boolean). A layer that
    is already pruned (by gradsift, or by ``torch.nn.utils.prune`` with a mask of the
    weight's dtype) gets its mask buffer updated in place (one forward pre-hook per
    weight, never a growing chain of pruning containers): ANDed with the new mask, so
    pruned weights stay pruned, or overwritten with ``replace=True`` (a shuffled mask
    moves the kept positions). A tied weight is masked in every module that holds it,
    the holders pruned here sharing one mask buffer (as they share the weight), and a
    parent that reads a pruned child's weight directly (``nn.MultiheadAttention``)
    refreshes it (``pruning.shared``).
    """
    install_masks_(model, masks, replace=replace, owned=False)


def install_masks_(
    model: nn.Module, masks: dict[str, torch.Tensor], *, replace: bool = False, owned: bool
) -> None:
    """``apply_masks_``; ``owned=True``: boolean masks the caller gives away become the
    new buffers themselves (``select``'s, views of one flat mask: no second copy)."""
    targets = prunable(model, list(masks))
    holders = owners(model)
    for name, (module, attr) in targets.items():
        tied, mask = holders[id(original(module, attr))], masks[name]
        prior = held_mask(tied)
        if not replace and prior is not None and any(mask_of(m, a) is not prior for m, a in tied):
            # holders that prune it differently (one pruned by torch.nn.utils.prune
            # alone): every holder gets what all of them and the new mask keep
            mask = as_bool(mask) & as_bool(prior)
        shared = None
        for m, a in tied:  # every holder of a tied weight
            shared = _install(m, a, mask, replace, owned, shared)
    refresh_readers_(model)


def held_mask(tied: list[tuple[nn.Module, str]]) -> torch.Tensor | None:
    """What the holders ``tied`` (``owners``' list for one tensor) have pruned of it:
    None when none is pruned, the mask buffer when only one is installed among them
    (shared by every pruned holder), else the AND of their masks, boolean."""
    found: list[torch.Tensor] = []
    for m, a in tied:
        mask = mask_of(m, a)
        if mask is not None and not any(mask is f for f in found):
            found.append(mask)
    if len(found) <= 1:
        return found[0] if found else None
    keep = as_bool(found[0]).clone()
    for mask in found[1:]:
        keep &= as_bool(mask)
    return keep


def _install(
    module: nn.Module, attr: str, mask: torch.Tensor, replace: bool, owned: bool, shared=None
) -> torch.Tensor:
    """Install ``mask`` on ``module.attr``; return its mask buffer: a new boolean one
    (``pruning.boolean_mask``), or the one already installed (by gradsift, or by
    ``torch.nn.utils.prune`` in the weight's dtype), updated in place. ``shared``: the
    buffer another holder of the same (tied) weight got, which a holder pruned here
    takes as its own, already filled."""
    existing = mask_of(module, attr)
    with torch.no_grad():
        mask = mask.detach().to(original(module, attr).device)
        keep = as_bool(mask)
        if existing is None:
            if shared is not None and shared.shape == mask.shape:  # filled by the first holder
                return install_(module, attr, as_bool(shared))  # (a copy if torch's, in 0/1)
            return install_(module, attr, keep if owned or keep is not mask else keep.clone())
        if mask.shape != existing.shape:
            raise ValueError(
                f"mask for {attr!r} must have the weight's shape {tuple(existing.shape)}, "
                f"got {tuple(mask.shape)}"
            )
        if replace:
            existing.copy_(mask)
        else:
            keep_where_(existing, keep)
        # recompute the masked weight without autograd history, so that the model
        # deep-copies and pickles (the pre-hook redoes it every forward); the old one
        # goes first, so the two never coexist
        delattr(module, attr)
        setattr(module, attr, masked(getattr(module, attr + "_orig"), existing))
    return existing
