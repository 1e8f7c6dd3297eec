"""Radix select and ordered compaction, the device-side steps of the Triton selection
(private helpers of ``gradsift._topk_triton``).

**Radix select.** The k-th largest of a set of ``BITS``-bit keys, exactly, one 8-bit
digit per pass from the top: pass ``p`` histograms the digit of the keys that agree
with the digits already fixed; the new digit is the largest ``d`` with at least
``need`` keys at or above it, and ``need`` drops by the count strictly above ``d``.
After ``BITS / 8`` passes the digits spell the k-th largest key ``v`` and ``need`` is
how many keys equal to ``v`` belong to the top k. Every program recomputes the
digits from the stored histograms (``resolve``), so no launch is spent on it and no
value ever goes to the host. (The same selection as CUB's and torch's radix select;
Alabi et al., "Fast k-selection algorithms for graphics processing units", 2012.)

**Ordered compaction.** Each tile counts its keys ``> v`` and ``== v``; one program
turns the counts into exclusive prefix sums (``scan_kernel``); each tile then writes
its chosen elements at ``above_before + min(ties_before, need)``. Output is in
ascending index order and the ties kept are the lowest-index ones, as on CPU.
"""

from __future__ import annotations

import triton
import triton.language as tl

from gradsift._triton_keys import _ROWS, _TILE, _TOTALS, domain_blocks

__all__ = ["histogram", "resolve", "scan_kernel", "stage_tiles"]

_SCAN = tl.constexpr(1024)  # tiles per iteration of the one-program scan


@triton.jit
def resolve(hist_ptr, k, P: tl.constexpr, BITS: tl.constexpr):
    """``(prefix, need)`` after the first ``P`` passes of the radix select for rank
    ``k``; with ``P = BITS // 8``, ``prefix`` is the k-th largest key itself."""
    bins = tl.arange(0, 256)
    prefix = tl.full([], 0, tl.uint32)
    need = tl.full([], 0, tl.int32) + k
    for p in tl.static_range(P):
        h = tl.load(hist_ptr + p * 256 + bins)
        at_or_above = tl.sum(h, 0) - tl.cumsum(h, 0) + h
        d = tl.max(tl.where(at_or_above >= need, bins, 0), 0)
        need = need - tl.sum(tl.where(bins > d, h, 0), 0)
        prefix = prefix | (d.to(tl.uint32) << (BITS - 8 * (p + 1)))
    return prefix, need


@triton.jit
def histogram(key, valid, prefix, P: tl.constexpr, BITS: tl.constexpr):
    """256-bin histogram of digit ``P`` of the keys that match ``prefix`` above it."""
    shift: tl.constexpr = BITS - 8 * (P + 1)
    if P > 0:
        valid = valid & ((key >> (shift + 8)) == (prefix >> (shift + 8)))
    digit = ((key >> shift) & 255).to(tl.int32)
    return tl.histogram(digit, 256, mask=valid)


@triton.jit
def stage_tiles(state_ptr, nblocks, cap, STAGE: tl.constexpr, ALL: tl.constexpr):
    """How many tiles a stage's domain has (stage 1's depends on stage 0's result)."""
    if STAGE == 0:
        tiles = tl.cdiv(nblocks, _TILE)
    else:
        count, _ = domain_blocks(state_ptr, nblocks, cap, ALL)
        tiles = tl.cdiv(count, _ROWS)
    return tiles


@triton.jit
def scan_kernel(counts_ptr, state_ptr, nblocks, cap, STAGE: tl.constexpr, ALL: tl.constexpr):
    """One program: per-tile ``(above, ties)`` counts, in place, become exclusive
    prefix sums; the two totals go to the stage's state slots."""
    tiles = stage_tiles(state_ptr, nblocks, cap, STAGE, ALL)
    carry_above = tl.full([], 0, tl.int32)
    carry_ties = tl.full([], 0, tl.int32)
    for start in range(0, tiles, _SCAN):
        t = start + tl.arange(0, _SCAN)
        live = t < tiles
        above = tl.load(counts_ptr + 2 * t, mask=live, other=0)
        ties = tl.load(counts_ptr + 2 * t + 1, mask=live, other=0)
        tl.store(counts_ptr + 2 * t, tl.cumsum(above, 0) - above + carry_above, mask=live)
        tl.store(counts_ptr + 2 * t + 1, tl.cumsum(ties, 0) - ties + carry_ties, mask=live)
        carry_above += tl.sum(above, 0)
        carry_ties += tl.sum(ties, 0)
    tl.store(state_ptr + _TOTALS + 2 * STAGE, carry_above)
    tl.store(state_ptr + _TOTALS + 2 * STAGE + 1, carry_ties)
