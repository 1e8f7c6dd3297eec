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

from gradsift.pruning.methods._linearised import Linearised, input_shape_of
from gradsift.pruning.methods.synflow_sharded import synflow_sharded
from gradsift.pruning.params import Selector, private_copy
from gradsift.pruning.registry import register_method

__all__ = ["linearised_rescorer", "linearised_scores", "synflow", "synflow_rescorer"]


def _name(power: int) -> str:
    return "synflow" if power == 1 else "synflow_l2"


def linearised_scores(model, targets, data, input_shape, dtype, power, split_batch=None):
    """Score the linearised (``power=1``) or squared (``power=2``) network of a
    private copy (``gradsift.pruning.methods._linearised``): one forward and one
    backward in ``dtype``, the scores in one flat buffer."""
    input_shape = input_shape_of(data, input_shape, split_batch, _name(power))
    return Linearised(model, targets, dtype, power, _name(power)).scores(input_shape)


def linearised_rescorer(model, data, *, params, input_shape, dtype, power, split_batch=None):
    """``rescore(masks) -> scores`` on one linearised network: equal to scoring the
    masked model each round, without re-copying and re-linearising the network
    every round (the masks are the only thing that change). Each round rebuilds the
    weights ``φ`` from the caller's (read, never written) with the masks applied,
    which gives the same forward pass and, times the zeroed weights, the same scores
    as masks installed with ``torch.nn.utils.prune``; the scores are written over
    ``φ``, so the round holds one buffer of the weights' size in ``dtype``."""
    shape = input_shape_of(data, input_shape, split_batch, _name(power))
    work, targets = private_copy(model, params, share_weights=True)
    net = Linearised(work, targets, dtype, power, _name(power))
    fresh = [True]  # φ as built; every later round's scores overwrote it

    def rescore(masks: dict | None) -> dict[str, torch.Tensor]:
        if masks is not None or not fresh[0]:
            net.refill_(masks)
        fresh[0] = False
        return net.scores(shape)

    return rescore


def synflow(model, targets, data=None, *, input_shape=None, dtype=torch.float64, split_batch=None):
    """θ ⊙ ∂R/∂θ with R the sum of the linearised network's output on ones; ``data``
    (or ``input_shape``) gives only the input's shape (``split_batch`` as in snip).
    The linearised copy holds every parameter and buffer in ``dtype``: a forward that
    casts (``x.float()``) needs ``dtype`` of that type, and is told so."""
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


register_method(
    "synflow",
    synflow,
    rescorer=synflow_rescorer,
    paper_iterations=100,
    writes_weights=False,
    sharded=synflow_sharded,
)
