"""SynFlow-L2: Gebhart, Saxena & Schrater, "A Unified Paths Perspective for Pruning at
Initialization", 2021, arXiv:2101.10552 (SynFlow: Tanaka et al., NeurIPS 2020,
arXiv:2006.05467).

SynFlow's linearisation with squared weights: every weight ``θ`` replaced by
``φ = θ ⊙ θ`` (biases and BatchNorm means zeroed, BatchNorm's eval scale squared, in
float64), ``R₂ = 1ᵀ f_φ(1)`` the sum of the output on an all-ones input (the sum over
input-output paths of the products of squared weights, the path kernel's natural
norm), and the score ``|θ| ⊙ ∂R₂/∂φ``: the definition of the PX codebase
(github.com/iurada/px-ntk-pruning, ``lib/pruners.py``, class ``SynFlowL2``), which
equals ``½ |∂R₂/∂θ|``. Iterative like SynFlow (its 100 rounds), with one squared copy
rescored under the masks.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from gradsift.pruning.methods.synflow import linearised_rescorer, linearised_scores
from gradsift.pruning.params import Selector
from gradsift.pruning.registry import checked_options, register_method

__all__ = ["synflow_l2", "synflow_l2_rescorer"]


def synflow_l2(
    model, targets, data=None, *, input_shape=None, dtype=torch.float64, split_batch=None
):
    """``|θ| ⊙ ∂R₂/∂φ`` at ``φ = θ ⊙ θ``, ``R₂`` the squared network's output sum on ones."""
    return linearised_scores(model, targets, data, input_shape, dtype, 2, split_batch)


def synflow_l2_rescorer(
    model: nn.Module, data: Iterable | None = None, *, params: Selector = None, **options
):
    """For iterative SynFlow-L2: ``rescore(masks) -> scores`` on one squared copy."""
    options = checked_options("synflow_l2", options)
    return linearised_rescorer(model, data, params=params, power=2, **options)


register_method(
    "synflow_l2",
    synflow_l2,
    rescorer=synflow_l2_rescorer,
    paper_iterations=100,
    writes_weights=False,
)
