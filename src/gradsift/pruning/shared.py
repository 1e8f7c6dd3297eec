"""Pruned weights that are read other than through their own module's forward.

``torch.nn.utils.prune`` recomputes ``weight = weight_orig * weight_mask`` in a forward
pre-hook of the module that holds the weight. Two things read a weight without that
hook running, and would then use a stale, frozen copy (no gradient reaches
``weight_orig``):

- a parent that reads a child's weight directly: ``nn.MultiheadAttention`` passes
  ``out_proj.weight`` to its functional form and never calls ``out_proj``. Such
  parents get a pre-hook that refreshes the child's pruned weights first;
- another module holding the same tensor (tied weights, ``decoder.weight =
  embedding.weight``): ``apply_masks_`` installs the mask on every holder, so that
  the tie holds for the masked weight too.
"""

from __future__ import annotations

from torch import nn

from gradsift.pruning.boolean_mask import masked

__all__ = ["RefreshPruned", "refresh_readers_"]

# (parent type, child attribute): parents that read the child's parameters directly
_DIRECT_READERS = ((nn.MultiheadAttention, "out_proj"),)


class RefreshPruned:
    """Forward pre-hook of a parent: recompute ``child``'s pruned tensors (those with
    an ``*_orig`` parameter and an ``*_mask`` buffer) as the pruning hook would.

    A plain object, not a closure, so that the model still pickles and deep-copies;
    after ``prune.remove`` on the child it does nothing.
    """

    def __init__(self, child: nn.Module):
        self.child = child

    def __call__(self, parent, args):
        child = self.child
        for name in list(child._buffers):
            attr = name[: -len("_mask")]
            if name.endswith("_mask") and attr + "_orig" in child._parameters:
                setattr(
                    child, attr, masked(child._parameters[attr + "_orig"], child._buffers[name])
                )


def refresh_readers_(model: nn.Module) -> None:
    """Give every parent in ``model`` that reads a pruned child's weight directly a
    ``RefreshPruned`` pre-hook (once)."""
    for parent in model.modules():
        for kind, attr in _DIRECT_READERS:
            child = getattr(parent, attr, None) if isinstance(parent, kind) else None
            if child is None or not any(n.endswith("_mask") for n in child._buffers):
                continue
            hooks = parent._forward_pre_hooks.values()
            if not any(isinstance(h, RefreshPruned) and h.child is child for h in hooks):
                parent.register_forward_pre_hook(RefreshPruned(child))
