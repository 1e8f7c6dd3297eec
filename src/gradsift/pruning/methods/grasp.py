"""GraSP: Wang, Zhang & Grosse, "Picking Winning Tickets Before Training by Preserving
Gradient Flow", ICLR 2020, arXiv:2002.07376.

Score ``θ ⊙ Hg`` over a class-balanced sample, logits divided by a temperature, with
``g = ∇L`` and ``H`` the Hessian of the loss. The paper removes the highest
``S(-θ) = -θ ⊙ Hg``; we return ``θ ⊙ Hg`` so that, as for every method, higher keeps.
Scored in train mode (BatchNorm normalises with batch statistics).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from gradsift.pruning.methods._hvp import (
    add_,
    batch_stats_only_,
    gradient,
    hvp_double,
    hvp_forward,
)
from gradsift.pruning.params import device_of, effective, leaves, original, param_path
from gradsift.pruning.registry import register_method
from gradsift.pruning.sampling import class_balanced_sample, need_data


def grasp(
    model,
    targets,
    data=None,
    *,
    loss_fn=F.cross_entropy,
    temperature: float = 200.0,
    samples_per_class: int = 25,
    num_classes: int | None = None,
    chunk_size: int = 64,
    reinit_linear: bool = False,
    hvp: str = "double",
    keep_graphs: bool = False,
):
    """θ ⊙ Hg over a class-balanced sample, logits divided by ``temperature``.

    ``g = ∇L`` and ``Hg`` are both taken over the whole sample, accumulated chunk by
    chunk (each chunk weighted by its share), so ``chunk_size`` bounds memory without
    changing the result, except through BatchNorm batch statistics in train mode,
    which depend on what shares a batch (as in the reference code).

    ``hvp="double"`` (default) takes Hg reverse-over-reverse, like the reference;
    ``hvp="forward"`` forward-over-reverse: the same values, an independent route that
    the tests cross-check, slower on CPU.

    Memory for time: the Hg pass needs each chunk's ``create_graph`` gradient, which
    the g pass could have built. By default only the last chunk's is kept from the g
    pass (used first, so no more memory is alive than for any other chunk); the rest
    are recomputed. ``keep_graphs=True`` keeps every chunk's (``hvp="double"`` only):
    no recomputation, but the whole sample's graph is alive at once
    (``docs/results.md`` §4 measures both).
    """
    need_data(data, "grasp")
    if hvp not in ("forward", "double"):
        raise ValueError(f"hvp must be 'forward' or 'double', got {hvp!r}")
    if keep_graphs and hvp != "double":
        raise ValueError("keep_graphs=True needs hvp='double' (it keeps create_graph graphs)")
    if num_classes is None:
        num_classes = _infer_classes(model, data)
    if reinit_linear:  # the reference code's option: xavier-normal Linear weights
        for m, a in targets.values():
            if isinstance(m, nn.Linear):
                with torch.no_grad():
                    nn.init.xavier_normal_(original(m, a))
    x, y = class_balanced_sample(data, samples_per_class, num_classes, device_of(model))
    model.train()
    batch_stats_only_(model)
    hg = _hessian_gradient(model, targets, x, y, loss_fn, temperature, chunk_size, hvp, keep_graphs)
    return {name: effective(m, a).detach() * h for (name, (m, a)), h in zip(targets.items(), hg)}


def _hessian_gradient(model, targets, x, y, loss_fn, temperature, chunk_size, hvp, keep_graphs):
    """``Hg`` over the sample ``(x, y)``, chunk by chunk (see ``grasp``)."""
    ws = leaves(targets)
    n = y.numel()
    chunks = [(x[i : i + chunk_size], y[i : i + chunk_size]) for i in range(0, n, chunk_size)]

    def weighted(out, yc):  # this chunk's share of the mean loss over the sample
        return loss_fn(out / temperature, yc) * (yc.numel() / n)

    keep = [hvp == "double" and (keep_graphs or i == len(chunks) - 1) for i in range(len(chunks))]
    g, kept = gradient(model, ws, weighted, chunks, keep)
    hg = [torch.zeros_like(t) for t in ws]
    for i in reversed(range(len(chunks))):  # kept graphs first, each freed once used
        grads, kept[i] = kept[i], None
        if grads is not None:
            add_(hg, hvp_double(model, ws, weighted, *chunks[i], g, grads))
    names = [param_path(model, m, a) for m, a in targets.values()]
    for (xc, yc), k in zip(chunks, keep):
        if k:
            continue
        if hvp == "forward":
            add_(hg, hvp_forward(model, names, ws, weighted, xc, yc, g))
        else:
            add_(hg, hvp_double(model, ws, weighted, xc, yc, g))
    return hg


def _infer_classes(model, data) -> int:
    x, _ = next(iter(data))
    with torch.no_grad():
        return int(model(x[:1].to(device_of(model))).shape[-1])


register_method("grasp", grasp)
