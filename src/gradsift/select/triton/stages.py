"""The Triton selection's kernel: one launch is one phase of one stage (see
``gradsift.select.triton.topk`` for the stages): a histogram pass of the radix
select, a count per program, or the ordered write of the chosen keys."""

from __future__ import annotations

import triton
import triton.language as tl

from gradsift.select.triton.keys import _FLAG, _TOTALS, flags_of
from gradsift.select.triton.radix import histogram, program_range, resolve
from gradsift.select.triton.tiles import domain, tile

__all__ = ["MAX_PROGRAMS", "STAGE0_PASSES", "stage_kernel"]

MAX_PROGRAMS = 2048  # the count arrays every program reads in the write phase
_MAX_PROGRAMS = tl.constexpr(MAX_PROGRAMS)
STAGE0_PASSES = 2  # radix passes over block keys: a 16-bit prefix is filter enough
_STAGE0_PASSES = tl.constexpr(STAGE0_PASSES)
_NOSPEC = ["n", "nblocks", "cap", "ecap", "k", "nprog", "phase", "p", "absolute", "all_", "m"]


@triton.jit
def _histogram_phase(
    x_ptr, r_ptr, u_ptr, m, keys_ptr, cand_ptr, lidx_ptr, lval_ptr, state_ptr, hist_ptr, n,
    nblocks, count, dense, start, end, v, p, absolute, all_, STAGE: tl.constexpr,
    MODE: tl.constexpr, BITS: tl.constexpr, BLOCK: tl.constexpr, WIDE: tl.constexpr,
):  # fmt: skip
    """Add this program's histogram of digit ``p`` to the stage's; stage 2 of an
    unstaged selection also raises the flags (no block-key pass read the data)."""
    acc = tl.zeros([256], dtype=tl.int32)
    flags = tl.full([], 0, tl.int64)
    for t in range(start, end):
        key, pos, valid, value, g = tile(
            t, x_ptr, r_ptr, u_ptr, m, keys_ptr, cand_ptr, lidx_ptr, lval_ptr, n, nblocks,
            count, dense, absolute, STAGE, MODE, BITS, BLOCK, WIDE,
        )  # fmt: skip
        acc += histogram(key, valid, v, p, BITS)
        if STAGE == 2:
            flags = flags | flags_of(value, g, valid, MODE)
    tl.atomic_add(hist_ptr + p * 256 + tl.arange(0, 256), acc.to(tl.int64))
    if STAGE == 2:
        flags = tl.where(all_ != 0, flags, 0)
        if flags != 0:
            tl.atomic_or(state_ptr + _FLAG, flags)


@triton.jit
def _compact_phase(
    x_ptr, r_ptr, u_ptr, m, keys_ptr, cand_ptr, lidx_ptr, lval_ptr, state_ptr, counts_ptr,
    out_ptr, val_ptr, n, nblocks, cap, ecap, nprog, count, dense, start, end, v, need, phase,
    absolute, STAGE: tl.constexpr, MODE: tl.constexpr, BITS: tl.constexpr,
    BLOCK: tl.constexpr, OUT: tl.constexpr, WIDE: tl.constexpr,
):  # fmt: skip
    """Phase 1: this program's counts of keys above and at the cut. Phase 2: its
    exclusive prefix from every program's counts, then its chosen keys in order."""
    pid = tl.program_id(0)
    progs = tl.arange(0, _MAX_PROGRAMS)
    if phase == 1:
        carry_above = tl.full([], 0, tl.int64)
        carry_ties = tl.full([], 0, tl.int64)
    else:
        above_all = tl.load(counts_ptr + 2 * progs, mask=progs < nprog, other=0)
        ties_all = tl.load(counts_ptr + 2 * progs + 1, mask=progs < nprog, other=0)
        carry_above = tl.sum(tl.where(progs < pid, above_all, 0), 0)
        carry_ties = tl.sum(tl.where(progs < pid, ties_all, 0), 0)
        if pid == 0:
            tl.store(state_ptr + _TOTALS + 2 * STAGE, tl.sum(above_all, 0))
            tl.store(state_ptr + _TOTALS + 2 * STAGE + 1, tl.sum(ties_all, 0))
    for t in range(start, end):
        key, pos, valid, value, g = tile(
            t, x_ptr, r_ptr, u_ptr, m, keys_ptr, cand_ptr, lidx_ptr, lval_ptr, n, nblocks,
            count, dense, absolute, STAGE, MODE, BITS, BLOCK, WIDE,
        )  # fmt: skip
        if STAGE < 2:  # every block (element) reaching the 16-bit prefix is a candidate
            above = (valid & (key >= v)).to(tl.int32)
            tie = tl.zeros_like(above)
        else:
            above = (valid & (key > v)).to(tl.int32)
            tie = (valid & (key == v)).to(tl.int32)
        if phase == 2:
            before = tl.cumsum(above, 0) - above + carry_above
            rank = tl.cumsum(tie, 0) - tie + carry_ties
            if STAGE == 0:
                listed = (above > 0) & (before < cap)  # a block index, 64-bit when WIDE
                tl.store(cand_ptr + before, pos.to(cand_ptr.dtype.element_ty), mask=listed)
            elif STAGE == 1:
                listed = (above > 0) & (before < ecap)
                tl.store(lidx_ptr + before, pos.to(tl.int64), mask=listed)
                tl.store(lval_ptr + before, value, mask=listed)
            else:
                chosen = (above > 0) | ((tie > 0) & (rank < need))
                dst = before + tl.minimum(rank, need)
                if OUT == 1:
                    tl.store(out_ptr + dst, pos.to(tl.int64), mask=chosen)
                    tl.store(val_ptr + dst, value, mask=chosen)
                else:
                    tl.store(out_ptr + pos, chosen.to(tl.int8), mask=valid)
        carry_above += tl.sum(above, 0)
        carry_ties += tl.sum(tie, 0)
    if phase == 1:
        tl.store(counts_ptr + 2 * pid, carry_above)
        tl.store(counts_ptr + 2 * pid + 1, carry_ties)


@triton.jit(do_not_specialize=_NOSPEC)
def stage_kernel(
    x_ptr, r_ptr, u_ptr, m, keys_ptr, cand_ptr, lidx_ptr, lval_ptr, state_ptr, hist_ptr,
    counts_ptr, out_ptr, val_ptr, n, nblocks, cap, ecap, k, nprog, phase, p, absolute, all_,
    STAGE: tl.constexpr, MODE: tl.constexpr, BITS: tl.constexpr, BLOCK: tl.constexpr,
    OUT: tl.constexpr, WIDE: tl.constexpr,
):  # fmt: skip
    """One launch of a stage over its tiles. ``phase`` 0: histogram of digit ``p``;
    1: count keys above and at the cut per program; 2: write the chosen ones in
    order (stage 0: candidate blocks; 1: listed elements; 2, OUT 1: indices and
    values, OUT 2: a mask). Stages 0 and 1 cut at stage 0's 16-bit prefix."""
    npass = _STAGE0_PASSES if STAGE < 2 else BITS // 8
    v, need = resolve(hist_ptr, k, tl.where(phase == 0, p, npass), BITS)
    tiles, count, dense = domain(state_ptr, n, nblocks, cap, ecap, all_, STAGE, BLOCK)
    start, end = program_range(tiles, nprog)
    if phase == 0:
        _histogram_phase(
            x_ptr, r_ptr, u_ptr, m, keys_ptr, cand_ptr, lidx_ptr, lval_ptr, state_ptr,
            hist_ptr, n, nblocks, count, dense, start, end, v, p, absolute, all_, STAGE,
            MODE, BITS, BLOCK, WIDE,
        )  # fmt: skip
    else:
        _compact_phase(
            x_ptr, r_ptr, u_ptr, m, keys_ptr, cand_ptr, lidx_ptr, lval_ptr, state_ptr,
            counts_ptr, out_ptr, val_ptr, n, nblocks, cap, ecap, nprog, count, dense, start,
            end, v, need, phase, absolute, STAGE, MODE, BITS, BLOCK, OUT, WIDE,
        )  # fmt: skip
