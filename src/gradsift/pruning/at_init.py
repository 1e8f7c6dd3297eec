"""``prune_at_init``: score, select, install; once or iteratively.

Iterative pruning follows SynFlow (Tanaka et al. 2020, arXiv:2006.05467, Alg. 1):
round ``i`` of ``n`` keeps density ``ρ^(i/n)`` (``schedule="exponential"``) of the
weights, rescoring the masked model each round; masks only ever lose weights.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from gradsift.checks import check_choice, check_int
from gradsift.pruning.budgets import check_budget
from gradsift.pruning.masks import apply_masks_, check_sparsity, masks_from_scores
from gradsift.pruning.params import Selector
from gradsift.pruning.registry import checked_options, get_method, score
from gradsift.pruning.sanity import check_sanity, inverted, sanity_masks_

__all__ = ["prune_at_init", "round_sparsities"]

_SCHEDULES = ("exponential", "linear")


def round_sparsities(sparsity: float, iterations: int, schedule: str) -> list[float]:
    """Target sparsity after each round; the last is exactly ``sparsity``."""
    check_choice("schedule", schedule, _SCHEDULES)
    iterations = check_int("iterations", iterations, minimum=1)
    density = 1.0 - sparsity
    out = []
    for i in range(1, iterations + 1):
        if schedule == "exponential":
            out.append(1.0 - density ** (i / iterations))
        else:
            out.append(sparsity * i / iterations)
    out[-1] = sparsity
    return out


def prune_at_init(
    model: nn.Module,
    method: str,
    sparsity: float,
    data: Iterable | None = None,
    *,
    budget=None,
    scope: str | None = None,
    iterations: int = 1,
    schedule: str = "exponential",
    min_per_layer: int = 0,
    shuffle: bool = False,
    sanity: str | None = None,
    generator: torch.Generator | None = None,
    params: Selector = None,
    **options,
) -> dict[str, torch.Tensor]:
    """Prune ``model`` in place before training; return the installed masks.

    Args:
        model: the network; masks are installed with ``torch.nn.utils.prune`` so that
            ``prune.is_pruned(model)``, ``module.weight_mask``, ``prune.remove``,
            ``state_dict`` and deepcopy/pickle behave as in PyTorch.
        method: a name from ``gradsift.list_methods()``.
        sparsity: fraction of the scored weights removed, in [0, 1).
        data: ``(inputs, targets)`` batches for data-driven methods.
        budget: ``"global"`` (default) ranks all layers together; ``"uniform"``,
            ``"er"``, ``"erk"``, ``"uniform+dense-first"`` or a callable fix each
            layer's exact count and rank within it (``gradsift.pruning.budgets``).
        scope: the older name: ``"layer"`` is ``budget="uniform"``.
        iterations: rounds of score-then-prune (SynFlow uses 100).
        schedule: ``"exponential"`` (density ``ρ^(i/n)``) or ``"linear"``.
        min_per_layer: keep at least this many weights per layer (collapse guard).
        shuffle: permute each layer's final mask (``sanity="shuffle-layer"``).
        sanity: a sanity-check variant, ``"reinit"``, ``"invert"``,
            ``"shuffle-layer"`` or ``"shuffle-global"`` (``gradsift.pruning.sanity``).
        generator: RNG for the shuffles and ``"reinit"``.
        params: which weights (see ``gradsift.score``).
        **options: passed to the scorer (see ``gradsift.score``).

    Returns:
        ``{name: mask}`` (float 0/1 tensors shaped like the weights).
    """
    check_sparsity(sparsity)
    budget = check_budget(budget, scope)
    sanity = check_sanity(sanity, shuffle)
    targets = round_sparsities(sparsity, iterations, schedule)
    entry = get_method(method)
    rescore = None
    if entry.rescorer is not None and len(targets) > 1:  # cheap rounds when it has them
        rescore = entry.rescorer(model, data, params=params, **checked_options(method, options))
    masks, workspace = None, {}
    for target in targets:
        if rescore is not None:
            scores = rescore(masks)
        else:
            scores = score(model, method, data, params=params, **options)
        masks = masks_from_scores(
            inverted(scores, sanity),
            target,
            budget=budget,
            previous=masks,
            min_per_layer=min_per_layer,
            workspace=workspace,
        )
        apply_masks_(model, masks)
    return sanity_masks_(model, masks, sanity, generator=generator)
