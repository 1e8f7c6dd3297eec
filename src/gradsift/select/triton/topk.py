"""Exact global top-k as Triton kernels, with no host synchronisation.

The same selection as ``gradsift.select`` (the k largest keys, ascending indices, the
lowest-index ties at the cut) in two stages, all decided on the device:

0. **Block keys** (when ``4 k <= N / BLOCK``, ``BLOCK`` = 32, or 8 for larger k):
   one pass reads every element, writes the largest key of each block of ``BLOCK``
   and ORs NaN into a flag. Two radix passes over the block keys give ``t``, the
   k-th largest block key with its low 16 bits cleared (exact for 16-bit keys). At
   least ``k`` blocks reach ``t``, so at least ``k`` elements do, so the k-th largest
   element is ``>= t``: every element of the top k, and every one tied with the k-th,
   lies in a block whose key is ``>= t``. Those blocks are compacted, in order, into
   a buffer of ``2 k + SLACK`` blocks.
1. **Exact stage** over the elements of those candidate blocks: radix select of the
   k-th largest key ``v``, then ordered compaction of ``key > v`` and the first
   ``need`` keys ``== v`` (``gradsift.select.triton.radix``). If the candidates
   overflow the buffer (many blocks tied at ``t``, as with mostly-zero gradients)
   the same kernels read every block instead: the dense fallback is decided on the
   device and costs speed, never exactness.

Every kernel runs a fixed grid of programs, each owning a contiguous range of tiles,
so launch shapes depend only on ``(N, k, dtype)`` and the kernels can be captured in
a CUDA graph. The pass, the phase and the order (``absolute``) are run-time
arguments: per dtype only three kernels are compiled (block keys, stage 0, stage 1),
which ``warmup`` can do ahead of the first call. Indices are 64-bit past 2**31
elements (a separate compilation, only for such sizes).

NaN cannot be ranked: ``topk_indices`` reads the flag once at the end (one host
sync) and raises ``ValueError`` as the CPU path does; the fused step
(``gradsift.select.triton.fused_step``) leaves it on the device instead.

Design after NVIDIA's AIR top-k (Zhang et al., "Parallel Top-K Algorithms on GPU: A
Comprehensive Study and New Methods", SC'23): a filter that reads the data once, then
radix passes over a small remainder; here with deterministic lowest-index ties.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from gradsift.select.exact import raise_nan
from gradsift.select.triton.keys import (
    _FLAG,
    _TOTALS,
    FLAG,
    NAN_KEY,
    TILE,
    block_keys_kernel,
    flags_of,
)
from gradsift.select.triton.radix import histogram, program_range, resolve
from gradsift.select.triton.tiles import domain, tile

__all__ = ["Selection", "stage_kernel", "topk_indices", "topk_mask", "warmup"]

SLACK = 1024  # candidate blocks beyond 2k: room for ties among block keys
PROGRAMS_PER_SM = 8  # resident programs per multiprocessor for the streaming passes
MAX_PROGRAMS = 2048  # the count arrays every program reads in the write phase
_MAX_PROGRAMS = tl.constexpr(MAX_PROGRAMS)
STAGE0_PASSES = 2  # radix passes over block keys: a 16-bit prefix is filter enough
_STAGE0_PASSES = tl.constexpr(STAGE0_PASSES)
_STATE = 8  # int64 slots: flags, then (above, ties) totals of each stage
_NOSPEC = ["n", "nblocks", "cap", "k", "nprog", "phase", "p", "absolute", "all_", "m"]


@triton.jit
def _histogram_phase(
    x_ptr, r_ptr, u_ptr, m, keys_ptr, cand_ptr, state_ptr, hist_ptr, n, nblocks, count,
    dense, start, end, v, p, absolute, all_, STAGE: tl.constexpr, MODE: tl.constexpr,
    BITS: tl.constexpr, BLOCK: tl.constexpr, WIDE: tl.constexpr,
):  # fmt: skip
    """Add this program's histogram of digit ``p`` to the stage's; stage 1 of an
    unstaged selection also raises the flags (no block-key pass read the data)."""
    acc = tl.zeros([256], dtype=tl.int32)
    flags = tl.full([], 0, tl.int64)
    for t in range(start, end):
        key, pos, valid, value, g = tile(
            t, x_ptr, r_ptr, u_ptr, m, keys_ptr, cand_ptr, n, nblocks, count, dense,
            absolute, STAGE, MODE, BITS, BLOCK, WIDE,
        )  # fmt: skip
        acc += histogram(key, valid, v, p, BITS)
        if STAGE == 1:
            flags = flags | flags_of(value, g, valid, MODE)
    tl.atomic_add(hist_ptr + p * 256 + tl.arange(0, 256), acc.to(tl.int64))
    if STAGE == 1:
        tl.atomic_or(state_ptr + _FLAG, tl.where(all_ != 0, flags, 0))


@triton.jit
def _compact_phase(
    x_ptr, r_ptr, u_ptr, m, keys_ptr, cand_ptr, state_ptr, counts_ptr, out_ptr, val_ptr,
    n, nblocks, cap, nprog, count, dense, start, end, v, need, phase, absolute,
    STAGE: tl.constexpr, MODE: tl.constexpr, BITS: tl.constexpr, BLOCK: tl.constexpr,
    OUT: tl.constexpr, WIDE: tl.constexpr,
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
            t, x_ptr, r_ptr, u_ptr, m, keys_ptr, cand_ptr, n, nblocks, count, dense,
            absolute, STAGE, MODE, BITS, BLOCK, WIDE,
        )  # fmt: skip
        if STAGE == 0:  # every block reaching the 16-bit prefix is a candidate
            above = (valid & (key >= v)).to(tl.int32)
            tie = tl.zeros_like(above)
        else:
            above = (valid & (key > v)).to(tl.int32)
            tie = (valid & (key == v)).to(tl.int32)
        if phase == 2:
            before = tl.cumsum(above, 0) - above + carry_above
            rank = tl.cumsum(tie, 0) - tie + carry_ties
            if STAGE == 0:
                tl.store(out_ptr + before, pos.to(tl.int32), mask=(above > 0) & (before < cap))
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
    x_ptr, r_ptr, u_ptr, m, keys_ptr, cand_ptr, state_ptr, hist_ptr, counts_ptr,
    out_ptr, val_ptr, n, nblocks, cap, k, nprog, phase, p, absolute, all_,
    STAGE: tl.constexpr, MODE: tl.constexpr, BITS: tl.constexpr, BLOCK: tl.constexpr,
    OUT: tl.constexpr, WIDE: tl.constexpr,
):  # fmt: skip
    """One launch of a stage over its tiles. ``phase`` 0: histogram of digit ``p``;
    1: count keys above and at the cut per program; 2: write the chosen ones in
    order (OUT 0: candidate blocks; 1: indices and values; 2: a mask)."""
    npass = _STAGE0_PASSES if STAGE == 0 else BITS // 8
    v, need = resolve(hist_ptr, k, tl.where(phase == 0, p, npass), BITS)
    tiles, count, dense = domain(state_ptr, nblocks, cap, all_, STAGE, BLOCK)
    start, end = program_range(tiles, nprog)
    if phase == 0:
        _histogram_phase(
            x_ptr, r_ptr, u_ptr, m, keys_ptr, cand_ptr, state_ptr, hist_ptr, n, nblocks,
            count, dense, start, end, v, p, absolute, all_, STAGE, MODE, BITS, BLOCK, WIDE,
        )  # fmt: skip
    else:
        _compact_phase(
            x_ptr, r_ptr, u_ptr, m, keys_ptr, cand_ptr, state_ptr, counts_ptr, out_ptr,
            val_ptr, n, nblocks, cap, nprog, count, dense, start, end, v, need, phase,
            absolute, STAGE, MODE, BITS, BLOCK, OUT, WIDE,
        )  # fmt: skip


@functools.cache
def _programs(device: torch.device) -> int:
    """Programs of the streaming passes: enough to keep every multiprocessor's memory
    pipe full (a few under the CPU interpreter, which runs them one by one)."""
    if device.type != "cuda":
        return 4
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return min(MAX_PROGRAMS, PROGRAMS_PER_SM * sms)


class Selection:
    """The buffers of one selection shape ``(N, k, dtype, device, output)``, reused
    across calls (the fused step keeps one); results in ``indices``, ``values`` (or
    ``mask``) and ``state[FLAG]`` after ``run``, all on the device."""

    def __init__(self) -> None:
        self._shape = None

    def _prepare(self, x: torch.Tensor, k: int, out: str) -> None:
        shape = (x.numel(), k, x.dtype, x.device, out)
        if shape == self._shape:
            return
        n, dev = x.numel(), x.device
        self.bits = 16 if x.element_size() == 2 else 32
        self.wide = n >= 2**31 - TILE
        self.block = 32
        if out != "mask" and 4 * k > n // 32:
            self.block = 8  # larger k: finer blocks keep the candidates few
        self.nblocks = nb = triton.cdiv(n, self.block)
        self.staged = out != "mask" and 4 * k <= nb
        self.cap = min(nb, 2 * k + SLACK) if self.staged else nb
        self.nprog = min(_programs(dev), max(1, triton.cdiv(n, TILE)))
        self.small = torch.zeros(_STATE + 2 * 4 * 256, dtype=torch.int64, device=dev)
        self.state, hist = self.small[:_STATE], self.small[_STATE:]
        self.hist = (hist[:1024], hist[1024:])
        self.counts = torch.empty(2 * MAX_PROGRAMS, dtype=torch.int64, device=dev)
        self.keys = torch.empty(nb if self.staged else 0, dtype=torch.int32, device=dev)
        self.cand = torch.empty(self.cap if self.staged else 0, dtype=torch.int32, device=dev)
        if out == "mask":
            self.mask = torch.empty(n, dtype=torch.uint8, device=dev)
        else:
            self.indices = torch.empty(k, dtype=torch.int64, device=dev)
            self.values = torch.empty(k, dtype=x.dtype, device=dev)
        self._shape = shape

    def run(
        self, x, k, *, absolute=True, residual=None, velocity=None, momentum=0.0, out="indices"
    ):
        """Select the top ``k`` of ``x`` (``absolute``: of ``|x|``), or with ``residual``
        of the error-feedback sum ``a`` (see ``gradsift.select.triton.keys``), writing
        nothing but this object's buffers. ``x`` and the states: flat, contiguous, one
        dtype."""
        self._prepare(x, k, out)
        mode = 0 if residual is None else 2 if velocity is not None else 1
        src = (x, residual, velocity, float(momentum))
        self.small.zero_()
        consts = dict(MODE=mode, BITS=self.bits, BLOCK=self.block, WIDE=self.wide)
        n, absolute = x.numel(), int(bool(absolute))
        if self.staged:
            block_keys_kernel[(self.nprog,)](
                *src, self.keys, self.state, n, self.nblocks, self.nprog, absolute,
                **consts, enable_fp_fusion=False,
            )  # fmt: skip
            self._stage(0, src, k, absolute, STAGE0_PASSES, 0, (self.cand, None), consts)
        outs = (self.mask, None) if out == "mask" else (self.indices, self.values)
        out_kind = 2 if out == "mask" else 1
        self._stage(1, src, k, absolute, self.bits // 8, out_kind, outs, consts)

    def _stage(self, stage, src, k, absolute, passes, out_kind, outs, consts):
        args = (*src, self.keys, self.cand, self.state, self.hist[stage], self.counts, *outs)
        sizes = (src[0].numel(), self.nblocks, self.cap, k, self.nprog)
        all_ = int(not self.staged)
        for phase, p in [(0, p) for p in range(passes)] + [(1, passes), (2, passes)]:
            stage_kernel[(self.nprog,)](
                *args, *sizes, phase, p, absolute, all_, STAGE=stage, OUT=out_kind,
                **consts, enable_fp_fusion=False,
            )  # fmt: skip

    def found_nan(self) -> bool:
        """Whether a NaN key was seen (one host sync)."""
        return bool(int(self.state[FLAG]) & NAN_KEY)


def topk_indices(x: torch.Tensor, k: int, absolute: bool) -> torch.Tensor:
    """``gradsift.topk_indices`` on the Triton kernels (arguments already checked)."""
    sel = Selection()
    sel.run(x, k, absolute=absolute)
    if sel.found_nan():
        raise_nan(x)
    return sel.indices


def topk_mask(x: torch.Tensor, k: int, absolute: bool) -> torch.Tensor:
    """``gradsift.topk_mask`` on the Triton kernels (arguments already checked)."""
    sel = Selection()
    sel.run(x, k, absolute=absolute, out="mask")
    if sel.found_nan():
        raise_nan(x)
    return sel.mask.view(torch.bool)


def warmup(device="cuda", dtypes=(torch.float16, torch.bfloat16, torch.float32)) -> None:
    """Compile the selection kernels for ``dtypes`` on ``device`` ahead of the first
    real call (each dtype: block keys, stage 0 and stage 1, both block sizes), so that
    a training loop's first step does not stall on compilation."""
    for dtype in dtypes:
        x = torch.randn(8 * TILE, device=device).to(dtype)
        for k in (1, 2000):  # 32-element blocks, then 8-element ones
            topk_indices(x, k, True)
