"""NTK-SAP: Wang, Li & Sun, "NTK-SAP: Improving Neural Network Pruning by Aligning
Training Dynamics", ICLR 2023, arXiv:2304.02840.

A data-free proxy for the NTK's spectrum: for Gaussian inputs ``x`` and a perturbation
``δ ~ N(0, I)`` of the weights, ``J(c) = Σ_n ‖f(x_n; θ ⊙ c) − f(x_n; (θ + εδ) ⊙ c)‖²``
(both networks share the mask ``c``), scored ``|∂J/∂c|`` at ``c = m`` (the current
mask; pruned weights score 0). "Multi-sampling": every draw takes fresh weights ``θ``
from the initialisation distribution (Kaiming normal, ``std = √(2 / fan_in)``,
the fan-in first in HF ``Conv1D``'s ``(in, out)`` weight; BatchNorm
``γ = 1, β = 0``; other parameters as they are), fresh ``x`` and ``δ``, and the
gradients add up over ``repeats`` draws before the absolute value. BatchNorm uses the
statistics of the unperturbed network on ``x`` for both networks (eval mode after a
statistics pass), as the authors' code does (github.com/YiteWang/NTK-SAP,
``Pruners/pruners.py``, ``NTKSAP``). Iterative: the paper's 20 rounds (its
``scripts/run.sh``), each round with new draws from one seeded generator; ε = 0.01 and
``repeats = 1`` are its defaults (CIFAR-10: ``repeats = 5``). Randomness comes only
from ``torch.Generator().manual_seed(seed)``, drawn on the CPU in a fixed order per draw:
each target's ``θ``, then ``x``, then each target's ``δ``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

from gradsift.checks import check_float, check_int, check_shape
from gradsift.pruning.inputs import forward, real_inputs, refuse_token_ids
from gradsift.pruning.install import apply_masks_
from gradsift.pruning.methods._hvp import add_
from gradsift.pruning.params import (
    Selector,
    device_of,
    is_conv1d,
    original,
    param_path,
    private_copy,
)
from gradsift.pruning.registry import checked_options, register_method

__all__ = ["ntk_sap", "ntk_sap_rescorer"]


def ntk_sap(
    model,
    targets,
    data=None,
    *,
    input_shape=None,
    batch_size: int | None = None,
    epsilon: float = 0.01,
    repeats: int = 1,
    reinit: bool = True,
    seed: int = 0,
    split_batch=None,
):
    """``|Σ_draws ∂J/∂c|`` over ``repeats`` draws of Gaussian inputs shaped like one
    batch of ``data`` (or ``(batch_size, *input_shape)``; ``split_batch`` as in snip);
    ``reinit=False`` keeps the model's own weights for every draw."""
    shape = _noise_shape(data, input_shape, batch_size, split_batch)
    refuse_token_ids(model, "ntk_sap")
    gen = torch.Generator().manual_seed(check_int("seed", seed))
    return _round(model, targets, shape, gen, epsilon, repeats, reinit)


def ntk_sap_rescorer(
    model: nn.Module, data: Iterable | None = None, *, params: Selector = None, **options
):
    """For iterative NTK-SAP: ``rescore(masks) -> scores`` on one private copy, each
    round with the generator's next draws (the first round equals ``score``)."""
    o = checked_options("ntk_sap", options)
    shape = _noise_shape(data, o["input_shape"], o["batch_size"], o["split_batch"])
    gen = torch.Generator().manual_seed(check_int("seed", o["seed"]))
    work, targets = private_copy(model, params)
    refuse_token_ids(work, "ntk_sap")

    def rescore(masks: dict | None) -> dict[str, torch.Tensor]:
        if masks is not None:
            apply_masks_(work, masks)
        return _round(work, targets, shape, gen, o["epsilon"], o["repeats"], o["reinit"])

    return rescore


def _noise_shape(data, input_shape, batch_size, split_batch) -> tuple[int, ...]:
    if data is not None:
        x = real_inputs(data, "ntk_sap", split_batch)
        input_shape = tuple(x.shape[1:]) if input_shape is None else input_shape
        batch_size = int(x.shape[0]) if batch_size is None else batch_size
    if input_shape is not None:
        input_shape = check_shape("input_shape", input_shape)
    if input_shape is None or batch_size is None:
        raise ValueError("ntk_sap needs data= or both input_shape= and batch_size=")
    return (check_int("batch_size", batch_size, minimum=1), *input_shape)


def _round(model, targets, shape, gen, epsilon, repeats, reinit):
    epsilon = check_float("epsilon", epsilon, "(0, inf)")
    repeats = check_int("repeats", repeats, minimum=1)
    device = device_of(model)
    paths = [param_path(model, m, a) for m, a in targets.values()]
    total = [torch.zeros_like(original(m, a)) for m, a in targets.values()]
    for _ in range(repeats):
        if reinit:
            _reinit_(model, targets, gen)
        theta = [original(m, a).detach() for m, a in targets.values()]
        x = torch.randn(shape, generator=gen, dtype=theta[0].dtype, device="cpu").to(device)
        _batch_statistics_(model, x)
        delta = [
            torch.randn(t.shape, generator=gen, dtype=t.dtype, device="cpu").to(device)
            for t in theta
        ]
        c = [torch.ones_like(t, requires_grad=True) for t in theta]
        f0 = forward(model, x, {p: t * ci for p, t, ci in zip(paths, theta, c)})
        moved = {p: (t + epsilon * d) * ci for p, t, d, ci in zip(paths, theta, delta, c)}
        f1 = forward(model, x, moved)
        add_(total, torch.autograd.grad((f0 - f1).square().sum(), c, materialize_grads=True))
    return {name: g.abs() for name, g in zip(targets, total)}


def _reinit_(model: nn.Module, targets: dict, gen: torch.Generator) -> None:
    """Fresh Kaiming-normal targets (fan-in, gain √2) and unit BatchNorm, from ``gen``."""
    with torch.no_grad():
        for name, (m, a) in targets.items():
            w = original(m, a)
            if w.dim() < 2:
                raise ValueError(
                    f"ntk_sap reinit=True draws Kaiming-normal weights, which {name} "
                    f"(shape {tuple(w.shape)}) has no fan-in for; pass reinit=False"
                )
            fan_in = w.shape[0] if is_conv1d(m) else w.shape[1] * math.prod(w.shape[2:])
            std = math.sqrt(2.0 / fan_in)
            w.copy_(torch.randn(w.shape, generator=gen, dtype=w.dtype, device="cpu").mul_(std))
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._NormBase) and m.affine:
                m.weight.fill_(1.0)
                m.bias.fill_(0.0)


def _batch_statistics_(model: nn.Module, x: torch.Tensor) -> None:
    """BatchNorm running statistics := the unperturbed network's batch statistics on
    ``x``; then eval mode, so that both networks normalise alike. Only the BatchNorm
    layers are in training mode for that pass (a Dropout stays off: no draw from the
    global generator)."""
    norms = [
        m
        for m in model.modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats
    ]
    model.eval()
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # cumulative average: one batch gives its own statistics
        m.train()
    if norms:
        with torch.no_grad():
            model(x)
    model.eval()


register_method("ntk_sap", ntk_sap, rescorer=ntk_sap_rescorer, paper_iterations=20)
