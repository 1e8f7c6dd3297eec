"""SNIP: Lee, Ajanthan & Torr, "SNIP: Single-shot Network Pruning based on Connection
Sensitivity", ICLR 2019, arXiv:1810.02340.

Score ``|g ⊙ θ|`` with ``g = ∂L/∂θ`` the gradient of the loss over ``num_batches``
batches. Scored in **train mode**: BatchNorm normalises each batch with its own
statistics, as the model will train and as the SNIP and Synaptic-Flow codes score it
when the model is in train mode (scoring in eval mode, with the running statistics of
an untrained network, gives a different ranking altogether: ``docs/results.md`` §5).

``num_batches=1`` (the default) is the SNIP paper's single mini-batch. The
Synaptic-Flow repository (Tanaka et al. 2020, arXiv:2006.05467) instead sums the
gradient of every batch of its pruning loader (10 samples per class, batches of
256): ``num_batches=None, batch_weighting="batch"`` reproduces it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812

from gradsift.checks import check_choice
from gradsift.pruning.boolean_mask import as_bool
from gradsift.pruning.gradients import GradBuffers
from gradsift.pruning.inputs import forward, num_samples
from gradsift.pruning.keep_where import keep_where_
from gradsift.pruning.params import device_of, mask_of, original
from gradsift.pruning.registry import register_method
from gradsift.pruning.sampling import BATCH_WEIGHTINGS, batch_weight, batches, need_data
from gradsift.pruning.sharded_scoring import like, local, rank0_gradients, share


def snip(
    model,
    targets,
    data=None,
    *,
    loss_fn=F.cross_entropy,
    num_batches: int | None = 1,
    batch_weighting: str = "size",
    split_batch=None,
):
    """``|g ⊙ θ|``, ``g = Σ_b w_b ∇L_b / Σ_b w_b`` over ``num_batches`` batches (None:
    all), ``L_b = loss_fn(model(inputs_b), targets_b)`` a batch's mean loss.

    ``batch_weighting="size"`` (default): ``w_b`` is the batch's number of samples, so
    ``g`` is the gradient of the mean loss over all samples read, whatever the
    batching (a loader's smaller last batch counts for its size). ``"batch"``:
    ``w_b = 1``, each batch's mean counts the same (the Synaptic-Flow repository sums
    them: a factor ``num_batches`` that does not change the ranking). With batches of
    equal size the two agree exactly.

    ``split_batch``: ``batch -> (inputs, targets)`` for batches that are not such
    pairs (``gradsift.pruning.inputs``).
    """
    need_data(data, "snip")
    check_choice("batch_weighting", batch_weighting, BATCH_WEIGHTINGS)
    model.train()
    buffers = GradBuffers(targets)  # gradients accumulate in one flat buffer
    first, total = None, 0.0
    for x, y in batches(data, device_of(model), num_batches, split_batch):
        # weights relative to the first batch's: equal batches add up unscaled
        first = first or batch_weight(num_samples(y), batch_weighting)
        w = batch_weight(num_samples(y), batch_weighting) / first
        buffers.accumulate_(loss_fn(forward(model, x), y), w)
        total += w
    if first is None:
        raise ValueError("data yielded no batches")
    ws, grads = buffers.weights, buffers.release_()
    with torch.no_grad():  # scores written over the gradients: no other copy
        for g, w, (m, a) in zip(grads, ws, targets.values()):
            g.div_(total).mul_(w).abs_()
            if mask_of(m, a) is not None:  # pruned: 0, whatever weight_orig holds there
                keep_where_(g, as_bool(mask_of(m, a)))
    return dict(zip(targets, grads))


def snip_sharded(
    model,
    targets,
    data=None,
    *,
    loss_fn=F.cross_entropy,
    num_batches: int | None = 1,
    batch_weighting: str = "size",
    split_batch=None,
):
    """``snip`` on a sharded model (FSDP2), scored on the shards; the same options.

    Batches: every rank must pass the **same** ``data``, the batches single-process
    SNIP would read. The gradient is rank 0's, reduced exactly
    (``sharded_scoring.rank0_gradients``: the other ranks run the same forward and
    backward for FSDP's collectives and contribute zeros), so the scores are
    single-process SNIP's bit for bit with one batch. With several, they are equal up
    to the rounding of the sum: single-process SNIP accumulates each batch into the
    gradient inside the layer's backward (``gradients.AccumulatingLinear``), autograd
    here adds whole batch gradients; and with unequal batch weights the loss is scaled
    by ``w_b`` before the backward instead of the gradient after it.
    """
    need_data(data, "snip")
    check_choice("batch_weighting", batch_weighting, BATCH_WEIGHTINGS)
    model.train()
    for m, a in targets.values():
        original(m, a).requires_grad_(True)
    first, total, mine = None, 0.0, share()
    with rank0_gradients(model):
        for x, y in batches(data, device_of(model), num_batches, split_batch):
            first = first or batch_weight(num_samples(y), batch_weighting)
            w = batch_weight(num_samples(y), batch_weighting) / first
            loss = loss_fn(forward(model, x), y)
            (loss if w == 1 and mine == 1 else loss * (w * mine)).backward()
            total += w
    if first is None:
        raise ValueError("data yielded no batches")
    with torch.no_grad():
        out = {}
        for name, (m, a) in targets.items():
            p = original(m, a)
            if p.grad is None:  # the loss does not reach it: a zero gradient, as unsharded
                out[name] = like(torch.zeros_like(local(p)), p)
            else:
                out[name] = like(local(p.grad).div(total).mul_(local(p)).abs_(), p)
        return out


register_method("snip", snip, writes_weights=False, sharded=snip_sharded)
