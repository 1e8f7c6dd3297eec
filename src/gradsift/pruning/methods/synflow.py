"""SynFlow: Tanaka, Kunin, Yamins & Ganguli, "Pruning neural networks without any data
by iteratively conserving synaptic flow", NeurIPS 2020, arXiv:2006.05467.

Score ``θ ⊙ ∂R/∂θ`` with ``R = 1ᵀ(∏_l |θ_l|)1``: the sum of the output of the
linearised network (every weight replaced by ``|θ|``, biases zeroed, BatchNorm in eval
mode with zero running mean) on an all-ones input, in float64. For a bias-free ReLU
network the per-layer score sums all equal ``R`` (the conservation law). Iterative
pruning (the paper: 100 rounds) rescores one linearised copy with the masks applied.

Scored in **eval mode** (BatchNorm as the affine map of its running statistics, the
mean zeroed), as in the Synaptic-Flow repository: with batch statistics the output
on a single all-ones input would not be a product of the layers' weights. The input
is real-valued, so a model whose input goes through ``nn.Embedding`` (token ids) is
not supported: it raises a ``ValueError`` that says so.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch
from torch import nn

from gradsift.pruning.inputs import real_inputs, refuse_token_ids
from gradsift.pruning.params import (
    Selector,
    device_of,
    leaves,
    mask_of,
    original,
    private_copy,
)
from gradsift.pruning.registry import register_method
from gradsift.pruning.sharded_scoring import like, local, rank0_gradients, share

__all__ = [
    "linearise_",
    "linearised_rescorer",
    "linearised_scores",
    "synflow",
    "synflow_rescorer",
    "synflow_sharded",
]

log = logging.getLogger(__name__)


def linearise_(model: nn.Module, dtype: torch.dtype, power: int = 1) -> None:
    """|θ|^power for every weight, 0 for every bias and BatchNorm mean: flow only through θ.

    With PyTorch's default (non-zero) biases, bias terms inject flow that bypasses
    pruned weights, which breaks SynFlow's conservation law; zeroing them in the
    copy restores it (the paper's models initialise biases to zero). With ``power=2``
    BatchNorm's eval scale ``γ/√(var+ε)`` becomes its square ``γ²/(var+ε)``, as every
    other linear map's entries do.
    """
    model.to(dtype).eval()
    _flow_only_(model, power)
    refuse_token_ids(model, _name(power))


def _flow_only_(model: nn.Module, power: int) -> None:
    """``linearise_`` without the dtype change, in place in each tensor's local part
    (a sharded model's shards)."""
    with torch.no_grad():
        for module in model.modules():
            for attr, p in module.named_parameters(recurse=False):
                if attr in ("bias", "bias_orig"):
                    local(p).zero_()
                else:
                    local(p).abs_().pow_(power)
            if (
                isinstance(module, nn.modules.batchnorm._NormBase)
                and module.running_mean is not None
            ):
                module.running_mean.zero_()
                if power == 2:
                    module.running_var.add_(module.eps).square_().sub_(module.eps)


def _input_shape(data, input_shape, split_batch, method):
    if input_shape is not None:
        return tuple(input_shape)
    if data is None:
        raise ValueError(f"{method} needs input_shape= or data= to know the input shape")
    return tuple(real_inputs(data, method, split_batch).shape[1:])


def _scores(model, targets, input_shape, dtype, power):
    """``|θ| ⊙ ∂R/∂φ`` at ``φ = |θ|^power``, ``R`` the output sum on ones; computed in
    place in the gradients (one float64 forward and backward, no other copy)."""
    ws = leaves(targets)
    ones = torch.ones((1, *input_shape), dtype=dtype, device=device_of(model))
    grads = torch.autograd.grad(model(ones).sum(), ws)
    out = {}
    with torch.no_grad():
        for (name, (m, a)), g in zip(targets.items(), grads):
            phi = original(m, a)
            g.mul_(phi if power == 1 else phi.sqrt())
            mask = mask_of(m, a)
            out[name] = g if mask is None else g.mul_(mask)
    return out


def linearised_scores(model, targets, data, input_shape, dtype, power, split_batch=None):
    """Score one linearised (``power=1``) or squared (``power=2``) private copy."""
    input_shape = _input_shape(data, input_shape, split_batch, _name(power))
    linearise_(model, dtype, power)
    return _scores(model, targets, input_shape, dtype, power)


def _name(power: int) -> str:
    return "synflow" if power == 1 else "synflow_l2"


def linearised_rescorer(model, data, *, params, input_shape, dtype, power, split_batch=None):
    """``rescore(masks) -> scores`` on one private linearised copy: equal to scoring
    the masked model each round, without re-copying and re-linearising the network
    every round (the masks are the only thing that change). The masks (monotone:
    a pruned weight stays pruned) are multiplied into the copy's weights in place,
    which gives the same forward pass and, times the zeroed weights, the same scores
    as masks installed with ``torch.nn.utils.prune``, with no mask buffers."""
    shape = _input_shape(data, input_shape, split_batch, _name(power))
    work, targets = private_copy(model, params)
    linearise_(work, dtype, power)

    def rescore(masks: dict | None) -> dict[str, torch.Tensor]:
        if masks is not None:
            _mask_in_place_(targets, masks)
        return _scores(work, targets, shape, dtype, power)

    return rescore


def _mask_in_place_(targets: dict, masks: dict) -> None:
    with torch.no_grad():
        for name, (m, a) in targets.items():
            phi = original(m, a)
            phi.mul_(masks[name].to(device=phi.device, dtype=phi.dtype))


def synflow(model, targets, data=None, *, input_shape=None, dtype=torch.float64, split_batch=None):
    """θ ⊙ ∂R/∂θ with R the sum of the linearised network's output on ones; ``data``
    (or ``input_shape``) gives only the input's shape (``split_batch`` as in snip)."""
    return linearised_scores(model, targets, data, input_shape, dtype, 1, split_batch)


def synflow_rescorer(
    model: nn.Module,
    data: Iterable | None = None,
    *,
    params: Selector = None,
    input_shape=None,
    dtype=torch.float64,
    split_batch=None,
):
    """For iterative SynFlow: ``rescore(masks) -> scores`` (``linearised_rescorer``)."""
    return linearised_rescorer(
        model,
        data,
        params=params,
        input_shape=input_shape,
        dtype=dtype,
        power=1,
        split_batch=split_batch,
    )


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
    shape = _input_shape(data, input_shape, split_batch, "synflow")
    p0 = next(iter(model.parameters()))
    if dtype != p0.dtype:
        log.info("sharded synflow computes in the model's %s, not %s", p0.dtype, dtype)
    model.eval()
    _flow_only_(model, 1)
    refuse_token_ids(model, "synflow")
    for m, a in targets.values():
        original(m, a).requires_grad_(True)
    ones = torch.ones((1, *shape), dtype=p0.dtype, device=local(p0).device)
    mine = share()
    with rank0_gradients(model):
        out = model(ones).sum()
        (out if mine == 1 else out * mine).backward()
    with torch.no_grad():
        scores = {}
        for name, (m, a) in targets.items():
            phi = original(m, a)
            scores[name] = like(local(phi.grad).mul(local(phi)), phi)
        return scores


register_method(
    "synflow",
    synflow,
    rescorer=synflow_rescorer,
    paper_iterations=100,
    sharded=synflow_sharded,
)
