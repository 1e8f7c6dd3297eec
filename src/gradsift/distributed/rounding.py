"""A gradient's kept values rounded to the wire's 16-bit dtype so that what stays
behind, ``values - sent``, is exact and finite: the hook keeps it in the residual
(``gradsift.distributed.state``), so rounding loses nothing, it only delays."""

from __future__ import annotations

import math

import torch

__all__ = ["round_for_wire", "top_of_both"]


def round_for_wire(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``values`` in ``dtype``, such that ``values - sent`` is exact and finite.

    Up to ``top``, the largest value finite and exact in both dtypes (65504 from
    float32 to float16; 65280 between float16 and bfloat16, where 65504 is no
    bfloat16 and float16's 65440 rounds to bfloat16's 65536), a value is rounded to
    ``dtype``: the difference is exact by Sterbenz. Up to ``2 top`` it sends ``top``
    (Sterbenz again). Past that it sends the largest multiple of its own spacing
    (ulp) not above ``top``: exact in both dtypes, and the difference is a multiple
    of the same spacing and smaller than the value, so exact too. The sign is the
    value's; the rest stays behind and goes out in the steps after, as much as
    ``top`` each. Only a value whose spacing exceeds ``top`` (float32 past 2**40, to
    float16) sends nothing."""
    top = top_of_both(values.dtype, dtype)
    if top >= torch.finfo(values.dtype).max:  # every finite value rounds to a finite one
        return values.to(dtype)
    mag = values.abs()
    ulp = torch.nextafter(mag, torch.full_like(mag, math.inf)) - mag
    aligned = top - torch.remainder(torch.full_like(mag, top), ulp)  # exact: powers of 2
    cap = torch.where(mag <= 2 * top, top, aligned)
    return torch.where(mag > top, torch.copysign(cap, values), values).to(dtype)


def top_of_both(a: torch.dtype, b: torch.dtype) -> float:
    """The largest value exact in both dtypes: ``(2 - eps) * 2^e``, the coarser one's
    ``eps``, the smaller largest exponent ``e``."""
    fa, fb = torch.finfo(a), torch.finfo(b)
    exponent = min(math.floor(math.log2(fa.max)), math.floor(math.log2(fb.max)))
    return (2.0 - max(fa.eps, fb.eps)) * 2.0**exponent
