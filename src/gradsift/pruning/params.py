"""Which parameters are scored and pruned, keyed by parameter name.

Names are logical: a weight pruned through ``torch.nn.utils.prune`` (stored as
``weight_orig`` with a ``weight_mask`` buffer) is still called ``"...weight"``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

__all__ = ["prunable", "Selector"]

# (name, module, parameter) -> bool
Selector = None | list | tuple | set | Callable[[str, nn.Module, torch.Tensor], bool]

_DEFAULT_TYPES = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


def prunable(model: nn.Module, params: Selector = None) -> dict[str, tuple[nn.Module, str]]:
    """Map logical parameter names to ``(module, attribute)`` for the scored weights.

    ``params``: None for the weights of Linear and Conv layers (no biases, no norm
    layers); a collection of names; or a predicate ``(name, module, tensor) -> bool``.
    """
    found: dict[str, tuple[nn.Module, str]] = {}
    for mod_name, module in model.named_modules():
        for attr, tensor in list(module.named_parameters(recurse=False)):
            base = attr[: -len("_orig")] if attr.endswith("_orig") else attr
            name = f"{mod_name}.{base}" if mod_name else base
            if name in found:
                continue
            if params is None:
                chosen = isinstance(module, _DEFAULT_TYPES) and base == "weight"
            elif callable(params):
                chosen = bool(params(name, module, tensor))
            else:
                chosen = name in params
            if chosen:
                found[name] = (module, base)
    if not callable(params) and params is not None:
        missing = sorted(set(params) - set(found))
        if missing:
            raise ValueError(f"params names not found in the model: {missing}")
    if not found:
        raise ValueError("no parameters selected for scoring (params=...)")
    return found


def original(module: nn.Module, attr: str) -> torch.Tensor:
    """The trainable tensor behind ``attr`` (``attr_orig`` when pruned)."""
    return (
        getattr(module, attr + "_orig", None)
        if hasattr(module, attr + "_orig")
        else getattr(module, attr)
    )


def mask_of(module: nn.Module, attr: str) -> torch.Tensor | None:
    """The installed ``torch.nn.utils.prune`` mask of ``attr``, if any."""
    return getattr(module, attr + "_mask", None)


def effective(module: nn.Module, attr: str) -> torch.Tensor:
    """The weight the forward pass uses: ``orig * mask`` when pruned."""
    mask = mask_of(module, attr)
    w = original(module, attr)
    return w if mask is None else w * mask
