"""SynFlow on a sharded model (FSDP2: ``DTensor`` parameters), scored on the model
itself rather than a linearised copy (FSDP gathers its own parameters; a copy would
not be sharded): SynFlow (Tanaka et al. 2020, arXiv:2006.05467) with ``|θ|`` swapped
into the local shards, biases and BatchNorm means zeroed and eval mode, all put back
by ``gradsift.score`` (``sharded_scoring.preserved``)."""

from __future__ import annotations

import logging

import torch
from torch import nn

from gradsift.pruning.inputs import refuse_token_ids
from gradsift.pruning.methods._linearised import (
    BIASES,
    check_reached,
    drop_statistics_,
    input_shape_of,
    linearise_norm_,
)
from gradsift.pruning.params import original
from gradsift.pruning.sharded_scoring import like, local, rank0_gradients, share

__all__ = ["synflow_sharded"]

log = logging.getLogger(__name__)


def _flow_only_(model: nn.Module, power: int, like: torch.Tensor) -> list[nn.Module]:
    """The linearised network in place in each tensor's local part (the shards):
    ``|θ|^power`` for every weight, 0 for every bias and BatchNorm mean. Returns the
    norms given statistics (``linearise_norm_``), to be dropped afterwards."""
    added = []
    with torch.no_grad():
        for module in model.modules():
            for attr, p in module.named_parameters(recurse=False):
                if attr in BIASES:
                    local(p).zero_()
                else:
                    local(p).abs_().pow_(power)
            if linearise_norm_(module, power, like.dtype, like.device):
                added.append(module)
    return added


def synflow_sharded(
    model, targets, data=None, *, input_shape=None, dtype=torch.float64, split_batch=None
):
    """``synflow`` on a sharded model (FSDP2), on the model itself: ``|θ|`` swapped
    into the local shards, biases and BatchNorm means zeroed, eval mode (all put back
    by ``score``), one forward on ones and one backward, the gradient reduced exactly
    (``sharded_scoring.rank0_gradients``).

    Precision: the **model's dtype**; ``dtype`` is not used (the shards FSDP gathers
    cannot change dtype). A float64 model gives single-process SynFlow's scores and
    masks bit for bit; a float32 model gives single-process SynFlow with
    ``dtype=torch.float32``, which can rank differently from the float64 default
    where scores are within float32 rounding of each other, or underflow or overflow
    (the product of ``|θ|`` over many layers).
    """
    shape = input_shape_of(data, input_shape, split_batch, "synflow")
    p0 = next(iter(model.parameters()))
    if dtype != p0.dtype:
        log.info("sharded synflow computes in the model's %s, not %s", p0.dtype, dtype)
    model.eval()
    here = local(p0)  # the dtype and device of the linearised network
    added = _flow_only_(model, 1, here)
    for m, a in targets.values():
        original(m, a).requires_grad_(True)
    mine = share()
    # the other ranks run the forward and backward for FSDP's collectives alone: on
    # zeros every activation of the linearised network is 0, so their zero share
    # stays 0 where rank 0's activations overflow (0 * inf would be NaN)
    ones = torch.full((1, *shape), mine, dtype=p0.dtype, device=here.device)
    guards = refuse_token_ids(model, "synflow")  # on the caller's model: removed after
    try:
        with rank0_gradients(model):
            out = model(ones).sum()
            (out if mine == 1 else out * mine).backward()
    finally:
        for handle in guards:
            handle.remove()
        for module in added:
            drop_statistics_(module)
    with torch.no_grad():
        # on every rank: FSDP leaves the same gradients None on each
        missed = [n for n, (m, a) in targets.items() if original(m, a).grad is None]
        check_reached("synflow", missed)
        scores = {}
        for name, (m, a) in targets.items():
            phi = original(m, a)
            scores[name] = like(local(phi.grad).mul(local(phi)), phi)
        return scores
