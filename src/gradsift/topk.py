"""Exact, fast top-k selection on one flat tensor: the kernel of gradsift.

``topk_indices(x, k)`` returns the indices of the ``k`` largest ``|x_i|`` (or ``x_i``).
It is exact: the multiset of selected keys equals ``torch.topk``'s.

Why not ``torch.topk``: on CPU, ``torch.topk`` over a 11.7M-element vector costs
~50 passes over memory. We do about two:

1. **Block keys.** View ``x`` as rows of ``B`` elements and reduce each row to its
   largest key ``m_b = max_j key(x_bj)``, reading ``x`` once and writing only ``N / B``
   values.
2. **Threshold.** Estimate a threshold ``t`` from a random sample of ``x`` so that
   about ``1.3 k`` keys are ``>= t``. Only blocks with ``m_b >= t`` can hold such
   keys, so only those are gathered and filtered exactly.
3. **Exact stage.** If at least ``k`` candidates satisfy ``key >= t``, then every key
   of the top-k (and every key tied with the k-th) is among them, because all other
   keys are ``< t <=`` the k-th largest candidate. An exact selection on the
   candidates finishes the job. Otherwise ``t`` is lowered and step 2 repeats; after
   a few tries a dense ``torch.topk`` is used. The sample therefore only ever affects
   speed, never the result.

Ties: among keys equal to the k-th largest key, the **lowest indices** are chosen,
so the result is deterministic. The returned indices are sorted **ascending**.

NaN policy: any NaN in ``x`` raises ``ValueError`` (a NaN gradient or score is a bug
upstream, and silently ranking it would hide it). ``+-inf`` rank as the largest
magnitudes (or as the extremes with ``absolute=False``), as in ``torch.topk``.

Backends: ``backend="torch"`` (default) is the above on CPU and a ``torch.topk``-based
exact selection elsewhere. ``backend="triton"`` runs the same selection as GPU kernels
(``gradsift._topk_triton``; needs the optional ``triton``) for float16, bfloat16 and
float32, with identical results; it is opt-in because its speed has not been measured
on a GPU yet.

References: Shi et al., "Understanding Top-k Sparsification in Distributed Deep
Learning" (2019, arXiv:1911.08772) and Lin et al., "Deep Gradient Compression"
(ICLR 2018, arXiv:1712.01887) for sampled thresholds.
"""

from __future__ import annotations

import torch

from gradsift._topk_exact import CHUNK, DENSE_BELOW, dense, key, raise_nan, top_mask
from gradsift._topk_sampled import BLOCK, block_key_dtype, block_keys, sampled
from gradsift._triton_runtime import use_triton
from gradsift.checks import check_int, has_nan

__all__ = [
    "BLOCK",
    "CHUNK",
    "block_key_dtype",
    "block_keys",
    "topk_from_block_keys",
    "topk_indices",
    "topk_mask",
]


def topk_indices(
    x: torch.Tensor, k: int, *, absolute: bool = True, backend: str = "torch"
) -> torch.Tensor:
    """Indices of the ``k`` largest ``|x|`` (``absolute=True``) or ``x``, exactly.

    Args:
        x: a 1-D floating tensor (float16, bfloat16, float32 or float64), CPU or CUDA.
        k: how many to select, ``1 <= k <= x.numel()`` (any integer type).
        absolute: rank by ``|x|`` (default) or by ``x``.
        backend: ``"torch"`` (default) or ``"triton"`` (GPU kernels, opt-in; float64
            stays on the torch path). Both give the same indices.

    Returns:
        An int64 tensor of ``k`` indices, sorted ascending. Among keys tied with the
        k-th largest key, the lowest indices are chosen.

    Raises:
        TypeError: ``x`` is not a floating tensor, or ``k`` is not an integer.
        ValueError: ``x`` is not 1-D or is empty, ``k`` is out of range, or ``x``
            contains NaN.
        ImportError: ``backend="triton"`` without triton installed.
    """
    k = check_topk_args(x, k)
    x = x.contiguous()
    if use_triton(x, backend):
        from gradsift import _topk_triton

        return _topk_triton.topk_indices(x, k, absolute)
    if x.device.type != "cpu" or x.numel() < DENSE_BELOW or k * 8 > x.numel():
        return dense(x, k, absolute)
    return sampled(x, k, absolute)


def topk_mask(
    x: torch.Tensor, k: int, *, absolute: bool = True, backend: str = "torch"
) -> torch.Tensor:
    """Boolean mask of the same ``k`` entries that ``topk_indices`` selects.

    For any ``k`` (pruning keeps most weights at low sparsity, where an index list
    is as large as the tensor): the k-th largest key ``v`` is found exactly by
    bracketing it between two sample quantiles and selecting within the bracket;
    then ``key > v`` plus the lowest-index ties at ``v``. ``backend`` as in
    ``topk_indices``.
    """
    k = check_topk_args(x, k)
    if use_triton(x, backend):
        from gradsift import _topk_triton

        return _topk_triton.topk_mask(x.contiguous(), k, absolute)
    keys = key(x.contiguous(), absolute)
    if has_nan(keys):
        raise_nan(x)
    return top_mask(keys, k)


def topk_from_block_keys(
    x: torch.Tensor, k: int, keys: torch.Tensor, *, absolute: bool = True
) -> torch.Tensor:
    """``topk_indices(x, k)`` given ``keys = block_keys(x)`` computed beforehand.

    Callers that produce ``x`` chunk by chunk (the error-feedback add of
    ``gradsift.sparsify``) compute the keys of each cache-hot chunk into a slice of
    ``keys``, then select here without reading ``x`` again.
    """
    k = check_topk_args(x, k)
    if k * 8 > x.numel() or x.numel() < DENSE_BELOW:
        return dense(x, k, absolute)
    return sampled(x, k, absolute, keys)


def check_topk_args(x, k) -> int:
    """Validate ``(x, k)`` for the selection functions; ``k`` as an ``int``."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(
            f"x must have a floating dtype (float16, bfloat16, float32, float64), got {x.dtype}"
        )
    if x.dim() != 1:
        raise ValueError(f"x must be 1-D, got shape {tuple(x.shape)}")
    if x.numel() == 0:
        raise ValueError("x must not be empty")
    k = check_int("k", k)
    if not 1 <= k <= x.numel():
        raise ValueError(f"k must satisfy 1 <= k <= x.numel() = {x.numel()}, got {k}")
    return k
