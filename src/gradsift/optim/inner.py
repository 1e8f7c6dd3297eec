"""What ``TopK`` accepts as its inner optimizer: checked at construction, and the
momentum and duplicate rules again at ``add_param_group`` (momentum at
``load_state_dict``)."""

from __future__ import annotations

import torch
from torch.optim import Optimizer

__all__ = ["check_inner", "check_no_inner_momentum", "checked_group"]


def check_inner(optimizer, *, momentum_correction, error_feedback: bool) -> None:
    """Raise ``TypeError``/``ValueError`` naming the argument for an inner optimizer
    ``TopK`` cannot wrap: not a ``torch.optim.Optimizer``, ``SparseAdam`` (the
    selection densifies sparse gradients), an inner momentum beside DGC's momentum
    correction, a parameter listed twice in a group, or no trainable parameter."""
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
    for i, group in enumerate(optimizer.param_groups):
        _check_no_duplicates(group["params"], f"param_groups[{i}]")
    params = [p for g in optimizer.param_groups for p in g["params"]]
    if not any(p.requires_grad for p in params):
        raise ValueError(
            f"optimizer has no trainable parameter (none of its {len(params)} has "
            "requires_grad=True): build it over the parameters you train"
        )


def check_no_inner_momentum(groups: list[dict], momentum_correction) -> None:
    """Raise ``ValueError`` where DGC's ``momentum_correction`` would stack on a
    group's own momentum (at construction, ``add_param_group``, ``load_state_dict``
    and every step: a scheduler may set it)."""
    if momentum_correction is not None and any(g.get("momentum", 0) for g in groups):
        raise ValueError(
            "momentum_correction replaces the inner optimizer's momentum: set its momentum=0 "
            "(and cycle_momentum=False in OneCycleLR or CyclicLR, which set it each step)"
        )


def checked_group(param_group: dict, defaults: dict, momentum_correction) -> dict:
    """``param_group`` for ``add_param_group``, its ``params`` read once into a list
    (a generator is consumed here), refused as at construction."""
    params = param_group["params"]
    params = [params] if isinstance(params, torch.Tensor) else list(params)
    group = {**param_group, "params": params}
    check_no_inner_momentum([{**defaults, **group}], momentum_correction)
    _check_no_duplicates(params, "the new param group")
    return group


def _check_no_duplicates(params: list, where: str) -> None:
    """Raise ``ValueError`` for a parameter listed twice in one group: torch.optim only
    warns (and applies its update twice), while the top-k selection counts a tensor's
    coordinates once, so the step would depend on whether k covers them."""
    seen: set[int] = set()
    for q in params:
        p = q[1] if isinstance(q, tuple) else q  # (name, parameter) pairs too
        if id(p) in seen:
            raise ValueError(
                f"{where} lists a parameter of shape {tuple(p.shape)} more than once: "
                "list each parameter once (torch.optim warns that this will be an error)"
            )
        seen.add(id(p))
