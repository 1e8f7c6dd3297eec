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

Backends (``gradsift.select.dispatch`` decides, from the device and what is
installed): ``backend="auto"`` (default) runs the Triton kernels of
``gradsift.select.triton`` on CUDA tensors when triton imports, and the torch path
otherwise; ``"torch"`` and ``"triton"`` force one. All give identical indices.

The package: ``exact`` (the dense path and the exact stage), ``sampled`` (the
sampled-threshold path with block keys), ``triton/`` (GPU kernels: order keys,
radix select, compaction, the fused error-feedback step), ``dispatch`` (which runs).

References: Shi et al., "Understanding Top-k Sparsification in Distributed Deep
Learning" (2019, arXiv:1911.08772) and Lin et al., "Deep Gradient Compression"
(ICLR 2018, arXiv:1712.01887) for sampled thresholds.
"""

from __future__ import annotations

import torch

from gradsift.checks import check_float_tensor, check_int, has_nan
from gradsift.select.dispatch import use_triton
from gradsift.select.exact import DENSE_BELOW, dense, key, raise_nan, top_mask
from gradsift.select.sampled import sampled as sampled_topk

__all__ = ["topk_indices", "topk_mask"]


def topk_indices(
    x: torch.Tensor, k: int, *, absolute: bool = True, backend: str = "auto"
) -> torch.Tensor:
    """Indices of the ``k`` largest ``|x|`` (``absolute=True``) or ``x``, exactly.

    Args:
        x: a 1-D floating tensor (float16, bfloat16, float32 or float64), CPU or CUDA.
        k: how many to select, ``1 <= k <= x.numel()`` (any integer type).
        absolute: rank by ``|x|`` (default) or by ``x``.
        backend: ``"auto"`` (default: the GPU kernels for CUDA tensors when triton
            imports, else the torch path), ``"torch"`` or ``"triton"``. All give the
            same indices.

    Returns:
        An int64 tensor of ``k`` indices, sorted ascending. Among keys tied with the
        k-th largest key, the lowest indices are chosen.

    Raises:
        TypeError: ``x`` is not a floating tensor, or ``k`` is not an integer.
        ValueError: ``x`` is not 1-D or is empty, ``k`` is out of range, or ``x``
            contains NaN.
        ImportError: ``backend="triton"`` without triton installed.

    Synchronises with the host once (the NaN check) on the triton backend and on the
    torch path's dense selection (small ``x`` or ``k > x.numel() / 8``); the torch
    path's sampled threshold also reads the threshold and the number of candidates
    above it: about three synchronisations per call.
    """
    k = _check_topk_args(x, k)
    x = x.detach().contiguous()  # a selection is not differentiable; out= ops refuse grad
    if use_triton(x, backend):
        from gradsift.select.triton import topk as triton_topk

        return triton_topk.topk_indices(x, k, absolute)
    if x.numel() < DENSE_BELOW or k * 8 > x.numel():
        return dense(x, k, absolute)
    return sampled_topk(x, k, absolute)


def topk_mask(
    x: torch.Tensor, k: int, *, absolute: bool = True, backend: str = "auto"
) -> torch.Tensor:
    """Boolean mask of the same ``k`` entries that ``topk_indices`` selects.

    For any ``k`` (pruning keeps most weights at low sparsity, where an index list
    is as large as the tensor): the k-th largest key ``v`` is found exactly by
    bracketing it between two sample quantiles and selecting within the bracket;
    then ``key > v`` plus the lowest-index ties at ``v``. ``backend`` as in
    ``topk_indices``.
    """
    k = _check_topk_args(x, k)
    x = x.detach().contiguous()  # a selection is not differentiable; out= ops refuse grad
    if use_triton(x, backend):
        from gradsift.select.triton import topk as triton_topk

        return triton_topk.topk_mask(x, k, absolute)
    keys = key(x, absolute)
    if has_nan(keys):
        raise_nan(x)
    return top_mask(keys, k)


def _check_topk_args(x, k) -> int:
    """Validate ``(x, k)`` for the selection functions; ``k`` as an ``int``."""
    check_float_tensor("x", x)
    if x.dim() != 1:
        raise ValueError(f"x must be 1-D, got shape {tuple(x.shape)}")
    if x.numel() == 0:
        raise ValueError("x must not be empty")
    k = check_int("k", k)
    if not 1 <= k <= x.numel():
        raise ValueError(f"k must satisfy 1 <= k <= x.numel() = {x.numel()}, got {k}")
    return k
