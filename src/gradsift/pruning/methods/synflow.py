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

__all__ = ["linearise_", "linearised_rescorer", "linearised_scores", "synflow", "synflow_rescorer"]


def linearise_(model: nn.Module, dtype: torch.dtype, power: int = 1) -> None:
    """|θ|^power for every weight, 0 for every bias and BatchNorm mean: flow only through θ.

    With PyTorch's default (non-zero) biases, bias terms inject flow that bypasses
    pruned weights, which breaks SynFlow's conservation law; zeroing them in the
    copy restores it (the paper's models initialise biases to zero). With ``power=2``
    BatchNorm's eval scale ``γ/√(var+ε)`` becomes its square ``γ²/(var+ε)``, as every
    other linear map's entries do.
    """
    model.to(dtype).eval()
    with torch.no_grad():
        for module in model.modules():
            for attr, p in module.named_parameters(recurse=False):
                if attr in ("bias", "bias_orig"):
                    p.zero_()
                else:
                    p.abs_().pow_(power)
            if (
                isinstance(module, nn.modules.batchnorm._NormBase)
                and module.running_mean is not None
            ):
                module.running_mean.zero_()
                if power == 2:
                    module.running_var.add_(module.eps).square_().sub_(module.eps)
    refuse_token_ids(model, _name(power))


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


def synflow(
    model, targets, data=None, *, input_shape=None, dtype=torch.float64, split_batch=None
):
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


register_method("synflow", synflow, rescorer=synflow_rescorer, paper_iterations=100)
