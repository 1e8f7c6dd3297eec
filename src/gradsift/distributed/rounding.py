"""A gradient's kept values rounded to the wire's 16-bit dtype so that what stays
behind, ``values - sent``, is exact and finite: the hook keeps it in the residual
(``gradsift.distributed.state``), so rounding loses nothing, it only delays."""

from __future__ import annotations

import math

import torch

__all__ = ["round_for_wire", "top_of_both"]


def round_for_wire(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``values`` in ``dtype``. Past ``top``, the largest value finite and exact in both
    dtypes (65504 from float32 to float16; 65280 between float16 and bfloat16, where
    65504 is no bfloat16 and float16's 65440 rounds to bfloat16's 65536), ``top`` is
    sent and the rest stays behind, up to twice it, and nothing beyond (all stays
    behind): so ``values - sent`` is always exact and finite (Sterbenz)."""
    top = top_of_both(values.dtype, dtype)
    if top >= torch.finfo(values.dtype).max:  # every finite value rounds to a finite one
        return values.to(dtype)
    clipped = values.clamp(-top, top)
    clipped = torch.where(values.abs() > 2 * top, torch.zeros_like(values), clipped)
    return clipped.to(dtype)


def top_of_both(a: torch.dtype, b: torch.dtype) -> float:
    """The largest value exact in both dtypes: ``(2 - eps) * 2^e``, the coarser one's
    ``eps``, the smaller largest exponent ``e``."""
    fa, fb = torch.finfo(a), torch.finfo(b)
    exponent = min(math.floor(math.log2(fa.max)), math.floor(math.log2(fb.max)))
    return (2.0 - max(fa.eps, fb.eps)) * 2.0**exponent
