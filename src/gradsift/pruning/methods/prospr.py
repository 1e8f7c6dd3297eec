"""ProsPr: Alizadeh, Tailor, Zintgraf, van Amersfoort, Farquhar, Lane & Gal, "Prospect
Pruning: Finding Trainable Weights at Initialization using Meta-Gradients", ICLR 2022,
arXiv:2202.08132.

Attach a mask ``c = 1`` to the weights, ``w_0 = θ ⊙ c``, take ``M`` SGD steps on every
parameter of the network, ``w_{k+1} = w_k - η v_k`` (``v_k = g_k`` or, with momentum
``μ``, ``v_k = μ v_{k-1} + g_k``, ``g_k = ∇L_k(w_k)``), and score each weight by the
meta-gradient ``|∂L_M(w_M)/∂c|``: differentiated through the whole trajectory, the
Hessian terms included (the paper's "full" meta-gradient). ``M = 0`` is SNIP. Defaults
(3 steps, η = 0.1, no momentum, one batch for every step) are those of the authors'
command line (github.com/mil-ad/prospr, ``cli.py``). Scored in train mode; BatchNorm
normalises with batch statistics and its running averages are left alone.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812

from gradsift.checks import check_float, check_int
from gradsift.pruning.boolean_mask import as_bool
from gradsift.pruning.inputs import forward
from gradsift.pruning.keep_where import keep_where
from gradsift.pruning.methods._hvp import batch_stats_only_, math_attention
from gradsift.pruning.params import device_of, mask_of, original, param_path
from gradsift.pruning.registry import register_method
from gradsift.pruning.sampling import batches, need_data

__all__ = ["prospr"]


def prospr(
    model,
    targets,
    data=None,
    *,
    steps: int = 3,
    lr: float = 0.1,
    momentum: float = 0.0,
    new_batches: bool = False,
    loss_fn=F.cross_entropy,
    split_batch=None,
):
    """``|∂L(w_M)/∂c|`` after ``steps`` differentiable SGD steps (``lr``, ``momentum``)
    from ``w_0 = θ ⊙ c``; every step and the meta-loss use the first batch, or with
    ``new_batches=True`` step ``k`` uses batch ``k`` and the meta-loss batch ``M``
    (cycling through ``data``; ``split_batch`` as in snip). Already pruned weights stay
    pruned in the steps and score 0. A tied tensor is one parameter of the steps.
    Attention runs on the math backend of ``scaled_dot_product_attention`` (the
    meta-gradient needs a double backward)."""
    need_data(data, "prospr")
    steps = check_int("steps", steps, minimum=0)
    lr = check_float("lr", lr, "(0, inf)")
    momentum = check_float("momentum", momentum, "[0, 1)")
    model.train()
    batch_stats_only_(model)
    stream = _cycle(data, device_of(model), split_batch)
    fast = {n: p.detach().clone().requires_grad_(True) for n, p in model.named_parameters()}
    masks = []
    for m, a in targets.values():
        theta = original(m, a).detach()
        if mask_of(m, a) is not None:  # pruned: 0, whatever weight_orig holds there
            theta = keep_where(theta, as_bool(mask_of(m, a)))
        masks.append(torch.ones_like(theta, requires_grad=True))
        fast[param_path(model, m, a)] = theta * masks[-1]
    velocity: dict = {}
    x, y = next(stream)
    with math_attention():
        for _ in range(steps):
            loss = loss_fn(forward(model, x, fast), y)
            grads = torch.autograd.grad(
                loss, list(fast.values()), create_graph=True, materialize_grads=True
            )
            fast = _sgd(fast, grads, velocity, lr, momentum)
            if new_batches:
                x, y = next(stream)
        meta = loss_fn(forward(model, x, fast), y)
        grads = torch.autograd.grad(meta, masks, materialize_grads=True)
    return {name: g.abs() for name, g in zip(targets, grads)}


def _sgd(params: dict, grads, velocity: dict, lr: float, momentum: float) -> dict:
    """One step of ``torch.optim.SGD`` (no dampening, no weight decay), out of place so
    that the new parameters stay functions of the old ones."""
    out = {}
    for (name, p), g in zip(params.items(), grads):
        if momentum:
            g = velocity[name] = g if name not in velocity else momentum * velocity[name] + g
        out[name] = p - lr * g
    return out


def _cycle(data, device, split_batch):
    """``data``'s batches without end, starting again when it is exhausted."""
    while True:
        empty = True
        for batch in batches(data, device, None, split_batch):
            empty = False
            yield batch
        if empty:
            raise ValueError("data yielded no batches")


register_method("prospr", prospr)
