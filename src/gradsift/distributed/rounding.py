"""A gradient's kept values rounded to the wire's 16-bit dtype so that what stays
behind, ``values - sent``, is exact and finite: the hook keeps it in the residual
(``gradsift.distributed.state``), so rounding loses nothing, it only delays."""

from __future__ import annotations

import math

import torch

__all__ = ["capped", "keep_within_", "round_for_wire", "top_of_both"]


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
    ``top`` each. Only a value whose spacing exceeds ``top`` (float32 from 2**39 on,
    to float16) sends nothing."""
    top = top_of_both(values.dtype, dtype)
    if top >= torch.finfo(values.dtype).max:  # every finite value rounds to a finite one
        return values.to(dtype)
    return capped(values, top).to(dtype)


def capped(values: torch.Tensor, top: float) -> torch.Tensor:
    """``values`` with every magnitude above ``top`` (a value exact in their dtype)
    replaced as ``round_for_wire`` says: ``top`` up to ``2 top``, past that the largest
    multiple of the value's own spacing not above ``top``; ``values - capped`` is
    exact and no larger than ``values``."""
    mag = values.abs()
    ulp = torch.nextafter(mag, torch.full_like(mag, math.inf)) - mag
    aligned = top - torch.remainder(torch.full_like(mag, top), ulp)  # exact: powers of 2
    cap = torch.where(mag <= 2 * top, top, aligned)
    return torch.where(mag > top, torch.copysign(cap, values), values)


def top_of_both(a: torch.dtype, b: torch.dtype) -> float:
    """The largest value exact in both dtypes: ``(2 - eps) * 2^e``, the coarser one's
    ``eps``, the smaller largest exponent ``e``."""
    fa, fb = torch.finfo(a), torch.finfo(b)
    exponent = min(math.floor(math.log2(fa.max)), math.floor(math.log2(fb.max)))
    return (2.0 - max(fa.eps, fb.eps)) * 2.0**exponent


def keep_within_(residual, idx: torch.Tensor, values: torch.Tensor, narrow) -> torch.Tensor:
    """``values`` (sent at ``idx`` of the hook's vector) capped where ``narrow``,
    ``[(start, end, dtype)]``, marks a range bound for a bucket of a narrower dtype (a
    float16 parameter in a float32 vector): below the largest value exact in that dtype
    and theirs (``capped``), the excess added back into ``residual`` (exactly; None:
    dropped, as unsent mass is without error feedback). Each rank's sent value then
    fits, and so does their mean: uncapped, a residual past 65504 came back as inf."""
    for start, end, dtype in narrow:
        at = ((idx >= start) & (idx < end)).nonzero().squeeze(1)
        v = values.index_select(0, at)
        c = capped(v, top_of_both(v.dtype, dtype))
        if residual is not None:
            residual.index_add_(0, idx.index_select(0, at), (v - c).to(residual.dtype))
        values = values.index_copy(0, at, c)
    return values
