"""Progressive skeletonisation, the loop that Iterative SNIP and FORCE share (private).

de Jorge, Sanyal, Behl, Torr, Rogez & Dokania, "Progressive Skeletonization: Trimming
more fat from a network at initialization", ICLR 2021, arXiv:2006.09081, Algorithm 1.

Starting from the dense weights ``θ`` and ``m_0 = 1``, round ``t`` of ``T`` computes
``g_t = ∇_w L(w)`` at ``w = θ ⊙ m_{t-1}`` and keeps the top of a saliency at the
round's density (``ρ^(t/T)`` for the exponential decay): Iterative SNIP ranks
``|w ⊙ g_t|`` among the weights still alive (a pruned weight stays pruned); FORCE
ranks ``|θ ⊙ g_t|`` over all weights, so a weight pruned earlier can come back. The
gradient reaches zeroed weights (a functional call, no gradient masking), which is
what lets FORCE revive them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812

from gradsift.checks import check_choice, check_int
from gradsift.pruning.inputs import forward
from gradsift.pruning.masks import check_sparsity, masks_from_scores
from gradsift.pruning.methods._hvp import add_
from gradsift.pruning.params import device_of, effective, param_path
from gradsift.pruning.sampling import batches, need_data
from gradsift.pruning.schedules import SCHEDULES, round_sparsities


def loss_gradient(model, paths, weights, data, loss_fn, num_batches, split_batch=None):
    """``∇_w Σ_b L_b(w)`` for the target weights set to ``weights``, over
    ``num_batches`` batches read afresh from ``data`` (``gradsift.pruning.inputs``)."""
    ws = [w.detach().requires_grad_(True) for w in weights]
    total = [torch.zeros_like(w) for w in ws]
    empty = True
    for x, y in batches(data, device_of(model), num_batches, split_batch):
        out = forward(model, x, dict(zip(paths, ws)))
        add_(total, torch.autograd.grad(loss_fn(out, y), ws))
        empty = False
    if empty:
        raise ValueError("data yielded no batches")
    return total


def progressive(
    model,
    targets,
    data,
    *,
    method,
    revive,
    sparsity,
    steps,
    decay,
    loss_fn,
    num_batches,
    split_batch=None,
    allocation="global",
    min_per_layer=0,
):
    """The final round's ``{name: saliency}``: its top ``1 - sparsity`` fraction (exact
    top-k, lowest-index ties) is the method's mask. Without ``revive``, weights pruned
    in round ``r < T`` score ``r - T`` instead: below every survivor, earlier lower.
    Each round keeps its weights under ``allocation`` and ``min_per_layer``
    (``masks_from_scores``), as ``prune_at_init`` then keeps the final ones."""
    need_data(data, method)
    check_sparsity(sparsity)
    steps = check_int("steps", steps, minimum=1)
    check_choice("decay", decay, SCHEDULES)
    model.train()
    paths = [param_path(model, m, a) for m, a in targets.values()]
    theta = [effective(m, a).detach() for m, a in targets.values()]
    masks = [torch.ones_like(t) for t in theta]
    pruned_in = [torch.zeros_like(t) for t in theta]

    def grad_at(weights):
        return loss_gradient(model, paths, weights, data, loss_fn, num_batches, split_batch)

    for r, target in enumerate(round_sparsities(sparsity, steps, decay)[:-1], start=1):
        saliency = _saliency(grad_at, theta, masks, revive)
        previous = None if revive else dict(zip(targets, masks))
        chosen = masks_from_scores(
            dict(zip(targets, saliency)),
            target,
            allocation=allocation,
            previous=previous,
            min_per_layer=min_per_layer,
        )
        for old, new, when in zip(masks, chosen.values(), pruned_in):
            when.masked_fill_((old > 0) & (new == 0), float(r))
        masks = [m.to(t) for m, t in zip(chosen.values(), theta)]
    saliency = _saliency(grad_at, theta, masks, revive)
    if not revive:
        saliency = [torch.where(m > 0, s, w - steps) for s, m, w in zip(saliency, masks, pruned_in)]
    return dict(zip(targets, saliency))


def _saliency(grad_at, theta, masks, revive):
    w = [t * m for t, m in zip(theta, masks)]
    g = grad_at(w)
    return [((t if revive else wi) * gi).abs() for t, wi, gi in zip(theta, w, g)]


def progressive_criterion(method: str, *, revive: bool, doc: str):
    """A registrable criterion running ``progressive`` with ``revive`` fixed; its
    defaults (60 steps, one batch a step) follow the authors' published commands
    (github.com/naver/force, README). ``prune_at_init`` hands it its ``sparsity``,
    ``allocation`` and ``min_per_layer``."""

    def criterion(
        model,
        targets,
        data=None,
        *,
        sparsity: float = 0.9,
        steps: int = 60,
        decay: str = "exponential",
        loss_fn=F.cross_entropy,
        num_batches: int | None = 1,
        split_batch=None,
        allocation="global",
        min_per_layer: int = 0,
    ):
        return progressive(
            model,
            targets,
            data,
            method=method,
            revive=revive,
            sparsity=sparsity,
            steps=steps,
            decay=decay,
            loss_fn=loss_fn,
            num_batches=num_batches,
            split_batch=split_batch,
            allocation=allocation,
            min_per_layer=min_per_layer,
        )

    criterion.__name__ = criterion.__qualname__ = method
    criterion.__doc__ = doc
    return criterion
