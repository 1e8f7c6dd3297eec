"""``prune_at_init``: score, select, install; once or iteratively.

Iterative pruning follows SynFlow (Tanaka et al. 2020, arXiv:2006.05467, Alg. 1):
round ``i`` of ``n`` keeps density ``ρ^(i/n)`` (``schedule="exponential"``) of the
weights, rescoring the masked model each round; masks only ever lose weights.
A criterion that runs its own schedule to a target (FORCE, Iterative SNIP: its
registry entry ``takes_sparsity``) is handed each round's target as ``sparsity=``,
and ``allocation=`` and ``min_per_layer=`` where it accepts them.

A model already pruned through ``torch.nn.utils.prune`` keeps its masks: they are the
first round's ``previous``, so its pruned weights count toward the target (whatever
they score) and the masks returned are the ones installed.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable

import torch
from torch import nn

from gradsift.budget import kept_count
from gradsift.pruning.allocation import check_allocation, layer_counts
from gradsift.pruning.install import held_mask, install_masks_
from gradsift.pruning.masks import check_sparsity, select
from gradsift.pruning.params import Selector, mask_of, original, owners, prunable
from gradsift.pruning.registry import checked_options, get_method, run_criterion, scoring_rng
from gradsift.pruning.sampling import replayable
from gradsift.pruning.sanity import check_sanity, inverted, sanity_masks_
from gradsift.pruning.schedules import round_sparsities
from gradsift.pruning.sharded import prune_shards
from gradsift.pruning.sharded_scoring import is_sharded_model

__all__ = ["prune_at_init", "round_sparsities"]


@torch.enable_grad()  # the criteria differentiate, also when called under no_grad
def prune_at_init(
    model: nn.Module,
    method: str,
    sparsity: float,
    data: Iterable | None = None,
    *,
    allocation=None,
    scope: str | None = None,
    iterations: int = 1,
    schedule: str = "exponential",
    min_per_layer: int = 0,
    shuffle: bool = False,
    sanity: str | None = None,
    generator: torch.Generator | None = None,
    params: Selector = None,
    budget=None,
    **options,
) -> dict[str, torch.Tensor]:
    """Prune ``model`` in place before training; return the installed masks.

    Args:
        model: the network; masks are installed with ``torch.nn.utils.prune`` so that
            ``prune.is_pruned(model)``, ``module.weight_mask``, ``prune.remove``,
            ``state_dict`` and deepcopy/pickle behave as in PyTorch.
        method: a name from ``gradsift.list_methods()``.
        sparsity: fraction of the scored weights removed, in [0, 1). ``0.0`` is allowed
            and a no-op on what the model computes: every weight is kept, all-ones
            masks are installed (so that code expecting a pruned model still works),
            after one scoring round whatever ``iterations`` says (a ``sanity=``
            variant still applies).
        data: ``(inputs, targets)`` batches for data-driven methods; a one-pass
            generator is read once and every round sees the same batches.
        allocation: how the kept weights are spread over the layers: ``"global"``
            (default) ranks all layers together; ``"uniform"``, ``"er"``, ``"erk"``,
            ``"uniform+dense-first"`` or a callable fix each layer's exact count and
            rank within it (``gradsift.pruning.allocation``).
        scope: deprecated older name of ``allocation`` (a ``DeprecationWarning``):
            ``"global"`` is ``"global"``, ``"layer"`` is ``"uniform"``.
        iterations: rounds of score-then-prune (SynFlow uses 100). A method with its own
            schedule (``get_method(m).takes_sparsity``) runs it within each round. A
            layer-wise allocation's rounds end at its one-shot counts.
        schedule: ``"exponential"`` (density ``ρ^(i/n)``) or ``"linear"``.
        min_per_layer: keep at least this many weights per layer (collapse guard).
        shuffle: permute each layer's final mask (``sanity="shuffle-layer"``).
        sanity: a sanity-check variant, ``"reinit"``, ``"invert"``,
            ``"shuffle-layer"`` or ``"shuffle-global"`` (``gradsift.pruning.sanity``).
        generator: RNG for the shuffles and ``"reinit"``.
        params: which weights (see ``gradsift.score``).
        budget: the deprecated name of ``allocation`` (a ``DeprecationWarning``).
        **options: passed to the scorer (see ``gradsift.score``).

    Returns:
        ``{name: mask}``: the model's installed ``*_mask`` buffers themselves
        (``torch.bool``, ``True`` keeps, on the weight's device; a mask installed before
        by ``torch.nn.utils.prune`` keeps its dtype; not copies, so clone them to keep a
        snapshot across later pruning). A weight pruned before stays pruned. On a
        sharded model (FSDP2): float 0/1 ``DTensor`` masks multiplied into the shards
        (``gradsift.pruning.sharded``).

    Memory: one round holds the scores or their one flat copy, never both whole
    (``gradsift.pruning.masks.select``; the flat buffer is not kept between rounds, so
    it never meets the next round's scores), a byte per weight for the boolean
    masks and, for a criterion with a rescorer (SynFlow, NTK-SAP), its private copy;
    such a criterion's masks are installed once its rounds are done: the boolean
    masks become the mask buffers (``gradsift.pruning.boolean_mask``), no copy. What
    the pruned model keeps afterwards is a byte per weight for the mask and the masked
    ``weight`` beside ``weight_orig``: 1.25x the bytes of float32 weights.

    Sharded models (FSDP2, ``DTensor`` parameters): scored on the shards, masks chosen
    globally (equal to the unsharded model's), multiplied into the local shards
    instead of ``torch.nn.utils.prune`` and returned as ``DTensor`` s; keep them
    applied while training with ``gradsift.pruning.hold_masks``. Only global
    allocation, no sanity variant, no ``min_per_layer`` (``gradsift.pruning.sharded``).
    """
    if is_sharded_model(model):  # FSDP2: no torch.nn.utils.prune (pruning.sharded)
        refused = dict(allocation=allocation, scope=scope, budget=budget, sanity=sanity)
        refused.update(min_per_layer=min_per_layer, shuffle=shuffle)  # generator: for those
        kw = dict(iterations=iterations, schedule=schedule, params=params, refused=refused)
        return prune_shards(model, method, sparsity, data, **kw, **options)
    check_sparsity(sparsity)
    allocation = check_allocation(allocation, scope=scope, budget=budget)
    sanity = check_sanity(sanity, shuffle, generator)
    targets = round_sparsities(sparsity, iterations, schedule)
    if sparsity == 0:
        targets = targets[:1]  # every round would keep everything
    entry = get_method(method)
    data = replayable(data)
    rescore = None
    spread = {"allocation": allocation, "min_per_layer": min_per_layer}
    if entry.rescorer is not None and len(targets) > 1:  # cheap rounds when it has them
        with scoring_rng(model):
            rescore = entry.rescorer(model, data, params=params, **checked_options(method, options))
    masks = _installed(model, params, sparsity)
    before = _kept_before(masks, sanity)
    last = _last_counts(model, params, masks, sparsity, allocation, min_per_layer, targets)
    for i, target in enumerate(targets):  # every round's floors: the last one's counts
        if rescore is not None:
            with scoring_rng(model):
                scores = rescore(masks)
        else:
            own = {**options, **_own_rounds(entry, target, spread)}
            scores = run_criterion(model, method, data, params=params, warn=False, options=own)
        kept = dict(previous=masks, consume=True, floors=last)  # consumed as it is read
        masks = select(inverted(scores, sanity), target, **spread, **kept)
        del scores
        if rescore is None and i < len(targets) - 1:  # the next round scores the model
            install_masks_(model, masks, owned=True)
    del rescore  # the rescorer's private copy
    install_masks_(model, masks, owned=True)
    sanity_masks_(model, masks, sanity, generator=generator, within=before)
    return {name: mask_of(m, a) for name, (m, a) in prunable(model, list(masks)).items()}


def _own_rounds(entry, target: float, spread: dict) -> dict:
    """What a criterion with rounds of its own (``takes_sparsity``) needs to run them as
    ``prune_at_init`` would: the round's target, and ``spread`` (allocation and
    ``min_per_layer``) where it takes them."""
    if not entry.takes_sparsity:
        return {}
    return {"sparsity": target, **{k: v for k, v in spread.items() if k in entry.options()}}


def _last_counts(model, params, masks, sparsity: float, allocation, min_per_layer: int, rounds):
    """The last round's counts per layer, the floors of every round (None: one round,
    or global): largest remainder is not monotone in the total (the Alabama paradox),
    so an earlier round could keep fewer in a layer than the last is due, capping it
    below its exact count."""
    if allocation == "global" or len(rounds) < 2:
        return None
    shapes = {n: original(m, a).shape for n, (m, a) in prunable(model, params, warn=False).items()}
    alive = None if masks is None else {n: int(torch.count_nonzero(masks[n])) for n in shapes}
    return layer_counts(shapes, sparsity, allocation, caps=alive, floor=min_per_layer)


def _kept_before(masks: dict | None, sanity: str | None) -> dict | None:
    """The masks a sanity shuffle draws within (an earlier pruning's); a copy, since
    the rounds consume ``masks``."""
    if masks is None or sanity not in ("shuffle-layer", "shuffle-global"):
        return None
    return {name: mask.clone() for name, mask in masks.items()}


def _installed(model: nn.Module, params: Selector, sparsity: float) -> dict | None:
    """The masks already installed on the selected weights (ones where none is), or
    None when none is; warns when they already prune more than ``sparsity``."""
    targets, holders = prunable(model, params), owners(model)
    # a tied weight: what any of its holders prunes (pruning.install.held_mask)
    found = {name: held_mask(holders[id(original(m, a))]) for name, (m, a) in targets.items()}
    if all(mask is None for mask in found.values()):
        return None
    masks = {
        name: (
            torch.ones_like(getattr(m, a), dtype=torch.bool)
            if found[name] is None
            else found[name].clone()
        )
        for name, (m, a) in targets.items()
    }
    total = sum(mask.numel() for mask in masks.values())
    pruned = total - sum(int(torch.count_nonzero(mask)) for mask in masks.values())
    if pruned > total - kept_count(total, sparsity):
        warnings.warn(
            f"prune_at_init: the model already has {100 * pruned / total:.1f}% of the "
            f"selected weights pruned, more than sparsity={sparsity}; pruned weights stay "
            "pruned, so the masks are left as they are",
            UserWarning,
            stacklevel=3,
        )
    return masks
