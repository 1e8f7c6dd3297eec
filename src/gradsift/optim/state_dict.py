"""``TopK``'s state dict: the inner optimizer's, with TopK's own per-parameter
tensors (residual, momentum) merged into the same integer-keyed ``state`` entries,
so one ``torch.save`` of it resumes bit for bit."""

from __future__ import annotations

import torch
from torch.optim import Optimizer

from gradsift.select.dtensor import is_sharded

__all__ = ["state_dict_with_own", "load_own_state"]

OWN_STATE = ("residual", "momentum")  # every per-parameter name TopK may keep


def _in_order(optimizer: Optimizer) -> list[torch.Tensor]:
    # the order torch.optim.Optimizer.state_dict uses for its integer keys
    return [p for group in optimizer.param_groups for p in group["params"]]


def state_dict_with_own(optimizer: Optimizer, own_state: dict, names: tuple[str, ...]) -> dict:
    """``optimizer.state_dict()`` with ``own_state[p][name]`` (cloned) added.

    Where the inner optimizer holds state for other parameters of this one's group
    but none for it (one backward never reached) and its own tensors are all zero, it
    gets no entry, as in torch: an entry with a residual alone would not load into the
    bare inner optimizer (Adam needs its ``step``), and an absent entry loads as zeros
    (``load_own_state``). Otherwise every parameter's tensors are there, zeros
    included (a group whose optimizer keeps no state, SGD without momentum), so that
    the dict is a complete template for ``dcp.load`` and its keys are the same on
    every rank.
    """
    sd = optimizer.state_dict()
    params = _in_order(optimizer)
    index = {id(p): i for i, p in enumerate(params)}
    group_of = {id(p): g for g, group in enumerate(optimizer.param_groups) for p in group["params"]}
    stateful = {group_of[id(p)] for i, p in enumerate(params) if i in sd["state"]}
    state = dict(sd["state"])
    for p, st in own_state.items():
        own = {name: st[name] for name in names if name in st}
        i = index[id(p)]
        never_reached = (
            i not in state
            and group_of[id(p)] in stateful
            and not any(_holds_nonzero(t) for t in own.values())
        )
        if not own or never_reached:
            continue
        # a new dict: the inner state_dict shares its per-param dicts with .state
        state[i] = {**state.get(i, {}), **{n: t.clone() for n, t in own.items()}}
    return {**sd, "state": state}


def _holds_nonzero(t: torch.Tensor) -> bool:
    """Whether ``t`` holds a non-zero anywhere: in every rank's shard of a ``DTensor``
    (whose ``any()`` reads this rank's alone, so that ranks would disagree on the keys
    a distributed checkpoint saves). The same on every rank."""
    if is_sharded([t]):
        return bool((t != 0).sum().full_tensor())
    return bool(t.any())


def load_own_state(optimizer: Optimizer, own_state: dict, sd: dict, names) -> None:
    """Split ``sd`` into the inner optimizer's part and ours; restore both in place.

    Keys are matched to parameters as ``torch.optim.Optimizer.load_state_dict`` does:
    by position in ``sd["param_groups"][g]["params"]`` (integers, or the names that
    ``torch.distributed.checkpoint.state_dict`` writes). Own tensors the dict lacks
    become zero: the load replaces the whole state, as torch's does. Our tensors are
    views of flat buffers: they are copied into, never replaced.
    """
    state = {i: dict(st) for i, st in sd["state"].items()}
    own = {i: {n: st.pop(n) for n in OWN_STATE if n in st} for i, st in state.items()}
    inner = {key: v for key, v in sd.items() if key != "topk"}  # "topk": older checkpoints
    inner["state"] = {i: st for i, st in state.items() if st}
    saved_keys = [i for group in sd["param_groups"] for i in group["params"]]
    param_of = dict(zip(saved_keys, _in_order(optimizer)))
    loaded = {param_of[i]: saved for i, saved in own.items() if i in param_of}
    sizes = [len(group["params"]) for group in optimizer.param_groups]
    same_groups = [len(group["params"]) for group in sd["param_groups"]] == sizes
    for i, saved in own.items():  # before anything loads (torch checks the groups)
        for name, value in saved.items():
            if same_groups and i in param_of and value.shape != param_of[i].shape:
                raise ValueError(
                    f"state_dict['state'][{i!r}][{name!r}] has shape {tuple(value.shape)}, "
                    f"its parameter {tuple(param_of[i].shape)}: a state of another model"
                )
    optimizer.load_state_dict(inner)
    for p in {**dict.fromkeys(own_state), **dict.fromkeys(loaded)}:
        st = own_state[p]
        for name in names:
            value = loaded.get(p, {}).get(name)
            if value is None:
                if name in st:
                    st[name].zero_()
            elif name in st:
                st[name].copy_(value)
            else:
                st[name] = value.to(device=p.device, dtype=p.dtype).clone()
