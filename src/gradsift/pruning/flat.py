"""Scores (or gradients) that lie in one flat buffer, layer after layer.

A criterion that writes its per-layer scores into views of one buffer hands the
selection (``gradsift.pruning.masks.select``) keys it can rank where they lie: no
second, flat copy of every score. ``flat_views`` makes the views, ``shared_flat``
recognises them.

Each view is its own tensor over the buffer's storage (``Tensor.set_``), not a slice
of one base tensor, so that autograd sees independent leaves: writing one in place
(a gradient accumulated into it, a score written over it) never bumps the version
counter of the others.
"""

from __future__ import annotations

import math

import torch

__all__ = ["flat_like", "flat_views", "shared_flat"]


def flat_views(shapes, dtype: torch.dtype, device) -> list[torch.Tensor]:
    """Uninitialised tensors of ``shapes`` lying back to back in one storage."""
    shapes = [tuple(s) for s in shapes]
    total = sum(math.prod(s) for s in shapes)
    storage = torch.empty(total, dtype=dtype, device=device).untyped_storage()
    views, offset = [], 0
    for shape in shapes:
        view = torch.empty(0, dtype=dtype, device=device)
        view.set_(storage, offset, shape)
        views.append(view)
        offset += math.prod(shape)
    return views


def flat_like(tensors, dtype: torch.dtype | None = None) -> list[torch.Tensor]:
    """``flat_views`` shaped like ``tensors`` (their dtype unless given, their device)."""
    tensors = list(tensors)
    if not tensors:
        return []
    return flat_views([t.shape for t in tensors], dtype or tensors[0].dtype, tensors[0].device)


def shared_flat(tensors) -> torch.Tensor | None:
    """The one flat tensor that ``tensors`` tile in order (contiguous, same dtype and
    storage, each starting where the previous one ends, from the storage's start to
    its end), or None. Survives ``detach``: it reads storages, not autograd links."""
    tensors = list(tensors)
    if not tensors:
        return None
    first = tensors[0]
    storage = first.untyped_storage()
    at = 0
    for t in tensors:
        if (
            t.dtype != first.dtype
            or not t.is_contiguous()
            or t.untyped_storage().data_ptr() != storage.data_ptr()
            or t.storage_offset() != at
        ):
            return None
        at += t.numel()
    if at * first.element_size() != storage.nbytes():
        return None
    flat = torch.empty(0, dtype=first.dtype, device=first.device)
    return flat.set_(storage, 0, (at,))
