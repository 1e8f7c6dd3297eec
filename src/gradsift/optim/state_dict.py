"""``TopK``'s state dict: the inner optimizer's, with TopK's own per-parameter
tensors (residual, momentum) merged into the same integer-keyed ``state`` entries,
so one ``torch.save`` of it resumes bit for bit."""

from __future__ import annotations

import torch
from torch.optim import Optimizer

__all__ = ["state_dict_with_own", "load_own_state"]

OWN_STATE = ("residual", "momentum")  # every per-parameter name TopK may keep


def _in_order(optimizer: Optimizer) -> list[torch.Tensor]:
    # the order torch.optim.Optimizer.state_dict uses for its integer keys
    return [p for group in optimizer.param_groups for p in group["params"]]


def state_dict_with_own(optimizer: Optimizer, own_state: dict, names: tuple[str, ...]) -> dict:
    """``optimizer.state_dict()`` with ``own_state[p][name]`` (cloned) added."""
    sd = optimizer.state_dict()
    index = {id(p): i for i, p in enumerate(_in_order(optimizer))}
    state = dict(sd["state"])
    for p, st in own_state.items():
        own = {name: st[name].clone() for name in names if name in st}
        if own:
            i = index[id(p)]
            # a new dict: the inner state_dict shares its per-param dicts with .state
            state[i] = {**state.get(i, {}), **own}
    return {**sd, "state": state}


def load_own_state(optimizer: Optimizer, own_state: dict, sd: dict, names) -> None:
    """Split ``sd`` into the inner optimizer's part and ours; restore both in place.

    Our tensors are views of flat buffers: they are copied into, never replaced.
    """
    state = {i: dict(st) for i, st in sd["state"].items()}
    own = {i: {n: st.pop(n) for n in OWN_STATE if n in st} for i, st in state.items()}
    inner = {key: v for key, v in sd.items() if key != "topk"}  # "topk": older checkpoints
    inner["state"] = {i: st for i, st in state.items() if st}
    optimizer.load_state_dict(inner)
    params = _in_order(optimizer)
    for i, saved in own.items():
        p = params[int(i)]
        for name, value in saved.items():
            if name not in names:
                continue
            if name in own_state[p]:
                own_state[p][name].copy_(value)
            else:
                own_state[p][name] = value.to(device=p.device, dtype=p.dtype).clone()
