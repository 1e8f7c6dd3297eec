"""What ``TopK`` accepts as its inner optimizer: checked at construction, and the
momentum rule again at ``add_param_group`` and ``load_state_dict``."""

from __future__ import annotations

import torch
from torch.optim import Optimizer

__all__ = ["check_inner", "check_no_inner_momentum"]


def check_inner(optimizer, *, momentum_correction, error_feedback: bool) -> None:
    """Raise ``TypeError``/``ValueError`` naming the argument for an inner optimizer
    ``TopK`` cannot wrap: not a ``torch.optim.Optimizer``, ``SparseAdam`` (the
    selection densifies sparse gradients), an inner momentum beside DGC's momentum
    correction, or no trainable parameter at all."""
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer)}")
    if isinstance(optimizer, torch.optim.SparseAdam):
        raise TypeError(
            "TopK cannot wrap SparseAdam: the top-k selection reads every coordinate, so "
            "sparse gradients are densified; use Adam, or nn.Embedding(sparse=False)"
        )
    if momentum_correction is not None:
        if not error_feedback:
            raise ValueError("momentum_correction needs error_feedback=True (DGC accumulates u)")
        check_no_inner_momentum(optimizer.param_groups, momentum_correction)
    params = [p for g in optimizer.param_groups for p in g["params"]]
    if not any(p.requires_grad for p in params):
        raise ValueError(
            f"optimizer has no trainable parameter (none of its {len(params)} has "
            "requires_grad=True): build it over the parameters you train"
        )


def check_no_inner_momentum(groups: list[dict], momentum_correction) -> None:
    """Raise ``ValueError`` where DGC's ``momentum_correction`` would stack on a
    group's own momentum (at construction, ``add_param_group`` and ``load_state_dict``)."""
    if momentum_correction is not None and any(g.get("momentum", 0) for g in groups):
        raise ValueError(
            "momentum_correction replaces the inner optimizer's momentum: set its momentum=0"
        )
