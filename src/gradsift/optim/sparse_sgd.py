"""Plain SGD applied to the selected coordinates only.

When the inner optimizer's step is exactly ``p -= lr * grad`` (SGD with no momentum,
weight decay, maximize or hooks), a dense step over a gradient that is zero except on
k coordinates changes only those k: applying ``-lr * values`` at the k indices gives
the same parameters without reading and writing all of them, up to one rounding:
``index_add_(alpha=-lr)`` rounds ``lr * g`` and then the sum, where the dense
``add_(g, alpha=-lr)`` may fuse them (FMA, one rounding). Where ``lr * g`` is exact (a
power-of-two ``lr`` in float32, float64 or bfloat16, away from their subnormals) the
two agree bit for bit; not in float16, whose narrow exponent range makes ``lr * g``
subnormal, and rounded, for a small gradient. The fused GPU step rounds as this one.
"""

from __future__ import annotations

import torch
from torch.optim import Optimizer, optimizer as optimizer_module

from gradsift.optim.flat_buffer import FlatBucket

__all__ = ["plain_sgd", "apply_sparse_sgd_"]


def plain_sgd(opt: Optimizer) -> bool:
    """Whether ``opt.step()`` is exactly ``p -= lr * grad`` with no hooks to run."""
    hooks = (
        opt._optimizer_step_pre_hooks,
        opt._optimizer_step_post_hooks,
        optimizer_module._global_optimizer_pre_hooks,
        optimizer_module._global_optimizer_post_hooks,
    )
    return (
        type(opt) is torch.optim.SGD
        and not any(hooks)
        and all(
            g["momentum"] == 0
            and g["weight_decay"] == 0
            and not g["maximize"]
            and not g.get("differentiable", False)
            and not isinstance(g["lr"], torch.Tensor)
            for g in opt.param_groups
        )
    )


@torch.no_grad()
def apply_sparse_sgd_(bucket: FlatBucket, lrs: list[float], idx, vals) -> None:
    """``p -= lr * g`` on the selected coordinates of ``bucket``; ``idx`` ascending."""
    cuts = torch.searchsorted(idx, bucket.bounds).tolist()
    for i, p in enumerate(bucket.params):
        lo, hi = cuts[i], cuts[i + 1]
        if lo < hi:
            local = idx[lo:hi] - bucket.offsets[i]
            p.data.view(-1).index_add_(0, local, vals[lo:hi], alpha=-lrs[i])
