"""Sanity checks for pruning at initialization: does a criterion know *which*
weights matter, or only *how many* per layer?

Frankle, Dziugaite, Roy & Carbin, "Pruning Neural Networks at Initialization: Why are
We Missing the Mark?", ICLR 2021, arXiv:2009.08576, Sec. 5; Su, Chen, Cai, Wu, Gao,
Wang & Lee, "Sanity-Checking Pruning Methods: Random Tickets can Win the Jackpot",
NeurIPS 2020, arXiv:2009.11094. Each variant keeps the total kept count exact:

- ``"shuffle-layer"``: each layer's mask randomly permuted (per-layer counts kept;
  ``prune_at_init(shuffle=True)``).
- ``"shuffle-global"``: the masks permuted as one vector over all layers (only the
  total kept): random pruning at the method's sparsity.
- ``"reinit"``: the mask kept, every pruned layer's weights re-drawn from that
  layer's own initial values (a random permutation of them: the same distribution,
  whatever initialiser made it, and no tie to the scores).
- ``"invert"``: every round ranks the negated scores, keeping what the criterion
  calls least important under the same allocation (per-layer counts kept under a
  layer-wise allocation; under ``"global"`` the inverted ranking sets them).
"""

from __future__ import annotations

import torch
from torch import nn

from gradsift.checks import check_choice
from gradsift.pruning.install import apply_masks_
from gradsift.pruning.masks import shuffle_masks
from gradsift.pruning.params import original, prunable

__all__ = ["SANITY", "check_sanity", "inverted", "reinit_", "shuffle_global", "sanity_masks_"]

SANITY = ("reinit", "invert", "shuffle-layer", "shuffle-global")


def check_sanity(sanity: str | None, shuffle: bool = False, generator=None) -> str | None:
    """``sanity`` (and the ``generator`` it draws from) validated; the older
    ``shuffle=True`` means ``"shuffle-layer"``."""
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {generator!r}")
    if sanity is not None:
        check_choice("sanity", sanity, SANITY)
    if shuffle:
        if sanity not in (None, "shuffle-layer"):
            raise ValueError(f'shuffle=True is sanity="shuffle-layer"; got sanity={sanity!r} too')
        return "shuffle-layer"
    return sanity


def inverted(scores: dict[str, torch.Tensor], sanity: str | None) -> dict[str, torch.Tensor]:
    """The scores negated for ``"invert"`` (higher keeps, so the lowest are kept)."""
    if sanity != "invert":
        return scores
    return {name: -s for name, s in scores.items()}


def shuffle_global(
    masks: dict[str, torch.Tensor],
    *,
    generator: torch.Generator | None = None,
    within: dict[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """One random permutation of all masks seen as one vector (total count kept);
    ``within`` as in ``shuffle_masks``."""
    flat = torch.cat([m.reshape(-1) for m in masks.values()])
    earlier = None
    if within is not None:
        earlier = torch.cat(
            [
                within[n].reshape(-1).to(flat.device, torch.bool)
                if within.get(n) is not None
                else torch.ones(m.numel(), dtype=torch.bool, device=flat.device)
                for n, m in masks.items()
            ]
        )
    flat = shuffle_masks({"all": flat}, generator=generator, within={"all": earlier})["all"]
    out, offset = {}, 0
    for name, m in masks.items():
        out[name] = flat[offset : offset + m.numel()].view_as(m).clone()
        offset += m.numel()
    return out


def reinit_(
    model: nn.Module, masks: dict[str, torch.Tensor], *, generator: torch.Generator | None = None
) -> None:
    """Permute each masked layer's (unmasked) weights in place: new initial values
    drawn from the layer's own, the mask untouched."""
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    with torch.no_grad():
        for module, attr in prunable(model, list(masks)).values():
            w = original(module, attr)
            perm = torch.randperm(w.numel(), generator=gen, device=gen.device).to(w.device)
            w.copy_(w.reshape(-1)[perm].view_as(w))


def sanity_masks_(
    model: nn.Module,
    masks: dict[str, torch.Tensor],
    sanity: str | None,
    *,
    generator: torch.Generator | None = None,
    within: dict[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """Apply the variants that act on installed masks (shuffles, reinit) to ``model``;
    the masks now installed. ``within``: the masks the model had before this pruning
    (the shuffles keep what they pruned pruned)."""
    if sanity == "shuffle-layer":
        masks = shuffle_masks(masks, generator=generator, within=within)
    elif sanity == "shuffle-global":
        masks = shuffle_global(masks, generator=generator, within=within)
    elif sanity == "reinit":
        reinit_(model, masks, generator=generator)
    else:
        return masks
    apply_masks_(model, masks, replace=True)
    return masks
