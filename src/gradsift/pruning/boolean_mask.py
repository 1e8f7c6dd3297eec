"""A boolean mask installed through ``torch.nn.utils.prune``.

``torch.nn.utils.prune`` reparametrises a pruned weight as the parameter
``weight_orig``, a ``weight_mask`` buffer, and ``weight = weight_orig ⊙ weight_mask``
recomputed before every forward by a pre-hook (a ``BasePruningMethod``). Its own
methods keep the mask in the weight's dtype: four bytes per float32 weight beside
the masked copy, so a pruned model holds twice its weights' bytes more than the
dense one. gradsift installs a ``torch.bool`` mask (one byte per weight) with
``BooleanMask``, a ``BasePruningMethod`` whose masked weight is
``torch.where(weight_mask, weight_orig, 0)``: no float copy of the mask is made in
the forward, and autograd keeps only the boolean mask for the backward
(``∂weight/∂weight_orig = weight_mask``).

What ``torch.nn.utils.prune`` offers keeps working: ``prune.is_pruned``,
``prune.remove`` (the masked weight made permanent), pruning again with torch's own
methods (their ``PruningContainer`` combines the masks into a new float mask buffer
in the weight's dtype, no longer the boolean one ``prune_at_init`` returned), and
state dicts (a float 0/1 mask loads into the boolean buffer as ``mask != 0``). The
only difference a reader sees is the buffer's dtype: ``mask.sum()`` counts the kept
weights, ``mask.float().mean()`` is the density.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils import prune

from gradsift.pruning.keep_where import keep_where

__all__ = ["BooleanMask", "as_bool", "install_", "masked"]


def as_bool(mask: torch.Tensor) -> torch.Tensor:
    """``mask`` as a boolean tensor: itself when boolean, else ``mask != 0``."""
    return mask if mask.dtype == torch.bool else mask != 0


def masked(orig: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``orig`` with zeros where ``mask`` prunes: ``torch.where`` on a boolean mask
    (``gradsift.pruning.keep_where``, fast on the CPU), the product
    ``torch.nn.utils.prune`` computes on a mask of another dtype."""
    if mask.dtype == torch.bool:
        return keep_where(orig, mask)
    return mask.to(dtype=orig.dtype) * orig


class BooleanMask(prune.BasePruningMethod):
    """The forward pre-hook of a weight pruned with a boolean mask (see the module
    docstring). It computes no mask itself: ``install_`` gives it one."""

    PRUNING_TYPE = "unstructured"

    def __init__(self, name: str):
        self._tensor_name = name

    def compute_mask(self, t, default_mask):
        return default_mask

    def apply_mask(self, module: nn.Module) -> torch.Tensor:
        name = self._tensor_name
        return masked(getattr(module, name + "_orig"), getattr(module, name + "_mask"))

    def __call__(self, module: nn.Module, inputs) -> None:
        """Recompute the masked weight before a forward, dropping the previous one
        first (``BasePruningMethod`` holds both for a moment: a weight-sized peak)."""
        module.__dict__.pop(self._tensor_name, None)
        setattr(module, self._tensor_name, self.apply_mask(module))


def install_(module: nn.Module, attr: str, mask: torch.Tensor) -> torch.Tensor:
    """Prune ``module.attr`` (a parameter, not yet pruned) with the boolean ``mask``,
    which becomes its ``*_mask`` buffer; return the buffer.

    The reparametrisation ``BasePruningMethod.apply`` installs, without its
    weight-sized ``torch.ones_like`` default mask; the masked weight is computed
    without autograd history (the pre-hook recomputes it at every forward), so the
    model deep-copies and pickles.
    """
    if mask.dtype != torch.bool:
        raise TypeError(f"mask for {attr!r} must be torch.bool, got {mask.dtype}")
    orig = module._parameters[attr]
    if mask.shape != orig.shape:
        raise ValueError(f"mask for {attr!r} must have the weight's shape {tuple(orig.shape)}")
    hook = BooleanMask(attr)
    module.register_parameter(attr + "_orig", orig)
    del module._parameters[attr]
    module.register_buffer(attr + "_mask", mask)
    with torch.no_grad():
        setattr(module, attr, hook.apply_mask(module))
    module.register_forward_pre_hook(hook)
    return mask
