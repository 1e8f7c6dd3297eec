"""Radix select and ordered compaction, the device-side steps of the Triton selection.

**Radix select.** The k-th largest of a set of ``BITS``-bit keys, exactly, one 8-bit
digit per pass from the top: pass ``p`` histograms the digit of the keys that agree
with the digits already fixed; the new digit is the largest ``d`` with at least
``need`` keys at or above it, and ``need`` drops by the count strictly above ``d``.
After ``BITS / 8`` passes the digits spell the k-th largest key ``v`` and ``need`` is
how many keys equal to ``v`` belong to the top k. Every program recomputes the
digits from the stored histograms (``resolve``), so no launch is spent on it and no
value ever goes to the host. (The same selection as CUB's and torch's radix select;
Alabi et al., "Fast k-selection algorithms for graphics processing units", 2012.)

**Ordered compaction.** Each program owns a contiguous range of tiles. It counts
its keys ``> v`` and ``== v``; in the next launch every program reads all the
programs' counts, sums those before its own (its exclusive prefix, with no separate
scan launch) and writes its chosen elements in tile order at ``above_before +
min(ties_before, need)``. Output is in ascending index order and the ties kept are
the lowest-index ones, as on CPU.

**Histograms.** ``tl.histogram`` is called without its ``mask=`` argument: on
triton 3.6 compiled for sm_90, a masked histogram of a tile reshaped from 2-D paired
the mask with the wrong elements (12 of 16 valid keys counted in bin 0, the padding's
bin), while the interpreter paired them right; that was the signed-selection bug.
Invalid lanes are put in bin 0 and subtracted from it instead, on 1-D tiles only.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["histogram", "program_range", "resolve"]


@triton.jit
def resolve(hist_ptr, k, npass, BITS: tl.constexpr):
    """``(prefix, need)`` after the first ``npass`` passes of the radix select for rank
    ``k`` (int64 histograms of 256 bins, one per pass); with ``npass = BITS // 8``,
    ``prefix`` is the k-th largest key itself."""
    bins = tl.arange(0, 256)
    prefix = tl.full([], 0, tl.uint32)
    need = tl.full([], 0, tl.int64) + k
    for q in range(0, npass):
        h = tl.load(hist_ptr + q * 256 + bins)
        at_or_above = tl.sum(h, 0) - tl.cumsum(h, 0) + h
        d = tl.max(tl.where(at_or_above >= need, bins, 0), 0)
        need = need - tl.sum(tl.where(bins > d, h, 0), 0)
        shift = BITS - 8 * (q + 1)
        prefix = prefix | (d.to(tl.uint32) << shift.to(tl.uint32))
    return prefix, need


@triton.jit
def histogram(key, valid, prefix, p, BITS: tl.constexpr):
    """256-bin int32 histogram of digit ``p`` (run time) of the valid keys that match
    ``prefix`` in the digits above it (see the module docstring on masking)."""
    shift = (BITS - 8 * (p + 1)).to(tl.uint32)
    high = tl.where(p > 0, shift + 8, 0).to(tl.uint32)
    match = valid & ((p == 0) | ((key >> high) == (prefix >> high)))
    digit = tl.where(match, (key >> shift) & 255, 0).to(tl.int32)
    h = tl.histogram(digit, 256)
    dropped = tl.sum(tl.where(match, 0, 1), 0)
    return h - tl.where(tl.arange(0, 256) == 0, dropped, 0)


@triton.jit
def program_range(tiles, nprog):
    """The contiguous tiles ``[start, end)`` this program owns of ``tiles``."""
    per = tl.cdiv(tiles, nprog)
    start = tl.program_id(0) * per
    return start, tl.minimum(start + per, tiles)
