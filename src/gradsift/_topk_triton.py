"""Exact global top-k as Triton kernels, with no host synchronisation (private).

The same selection as ``gradsift.topk`` (the k largest keys, ascending indices, the
lowest-index ties at the cut) in two stages, all decided on the device:

0. **Block keys** (when ``4 k <= N / BLOCK``): one pass reads every element, writes the
   largest key of each block of ``BLOCK`` and ORs NaN into a flag. A radix select
   finds the k-th largest block key ``t``. At least ``k`` blocks reach ``t``, so at
   least ``k`` elements do, so the k-th largest element is ``>= t``: every element of
   the top k, and every one tied with the k-th, lies in a block whose key is ``>= t``.
   Those blocks are compacted, in order, into a buffer of ``2 k + SLACK`` blocks.
1. **Exact stage** over the elements of those candidate blocks: radix select of the
   k-th largest key ``v``, then ordered compaction of ``key > v`` and the first
   ``need`` keys ``== v``. If the candidates overflow the buffer (many blocks tied at
   ``t``, as with mostly-zero gradients) the same kernels read every block instead:
   the dense fallback is decided on the device and costs speed, never exactness.

Launch shapes depend only on ``(N, k, dtype)``, so the kernels can be captured in a
CUDA graph. NaN cannot be ranked: ``topk_indices`` reads the flag once at the end
(one host sync) and raises ``ValueError`` as the CPU path does; the fused step
(``gradsift._sparsify_triton``) leaves it on the device instead.

Sampled-threshold top-k (Shi et al., "Understanding Top-k Sparsification in
Distributed Deep Learning", 2019, arXiv:1911.08772) motivates the block filter; here
the threshold is exact, so no retry is ever needed.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gradsift._topk_exact import raise_nan
from gradsift._triton_keys import BLOCK, FLAG, NAN_KEY, ROWS, TILE, block_keys_kernel, domain_tile
from gradsift._triton_radix import histogram, resolve, scan_kernel, stage_tiles

__all__ = ["Selection", "topk_indices", "topk_mask"]

SLACK = 1024  # candidate blocks beyond 2k: room for ties among block keys
MIN_PROGRAMS = 256  # stage-1 programs at least, so that a dense fallback spreads out
MAX_N = 2**31 - 1 - BLOCK  # indices are computed in int32
_STATE = 8  # int32 slots: flags, then (above, ties) totals of each stage


@triton.jit
def stage_kernel(
    x_ptr, r_ptr, u_ptr, m, keys_ptr, cand_ptr, state_ptr, hist_ptr, counts_ptr,
    out_ptr, val_ptr, n, nblocks, cap, k, nprog,
    STAGE: tl.constexpr, ALL: tl.constexpr, MODE: tl.constexpr, ABSOLUTE: tl.constexpr,
    BITS: tl.constexpr, PHASE: tl.constexpr, P: tl.constexpr, OUT: tl.constexpr,
    FLAGS: tl.constexpr,
):  # fmt: skip
    """One pass of a stage over its tiles, grid-strided: PHASE 0 histograms digit
    ``P``; 1 counts keys above and at the cut per tile; 2 writes the chosen ones
    (OUT 0: candidate blocks; 1: indices and values; 2: a mask)."""
    pid = tl.program_id(0)
    v, need = resolve(hist_ptr, k, P, BITS)
    acc = tl.zeros([256], dtype=tl.int32)
    tiles = stage_tiles(state_ptr, nblocks, cap, STAGE, ALL)
    for t in range(pid, tiles, nprog):
        key, pos, valid, value = domain_tile(
            t, x_ptr, r_ptr, u_ptr, m, keys_ptr, cand_ptr, state_ptr, n, nblocks, cap,
            STAGE, ALL, MODE, ABSOLUTE, BITS, FLAGS,
        )  # fmt: skip
        above = (valid & (key > v)).to(tl.int32)
        tie = (valid & (key == v)).to(tl.int32)
        if PHASE == 0:
            acc += histogram(key, valid, v, P, BITS)
        elif PHASE == 1:
            tl.store(counts_ptr + 2 * t, tl.sum(above, 0))
            tl.store(counts_ptr + 2 * t + 1, tl.sum(tie, 0))
        else:
            before = tl.cumsum(above, 0) - above + tl.load(counts_ptr + 2 * t)
            rank = tl.cumsum(tie, 0) - tie + tl.load(counts_ptr + 2 * t + 1)
            if STAGE == 0:  # every block reaching the cut is a candidate
                chosen = (above + tie) > 0
                dst = before + rank
            else:
                chosen = (above > 0) | ((tie > 0) & (rank < need))
                dst = before + tl.minimum(rank, need)
            if OUT == 0:
                tl.store(out_ptr + dst, pos, mask=chosen & (dst < cap))
            elif OUT == 1:
                tl.store(out_ptr + dst, pos.to(tl.int64), mask=chosen)
                tl.store(val_ptr + dst, value, mask=chosen)
            else:
                tl.store(out_ptr + pos, chosen.to(tl.int8), mask=valid)
    if PHASE == 0:
        tl.atomic_add(hist_ptr + P * 256 + tl.arange(0, 256), acc)


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
        if n > MAX_N:
            raise ValueError(f"backend='triton' handles x.numel() <= {MAX_N}, got {n}")
        self.nblocks = nb = triton.cdiv(n, BLOCK)
        self.bits = 16 if x.element_size() == 2 else 32
        self.staged = out != "mask" and 4 * k <= nb
        self.cap = min(nb, 2 * k + SLACK) if self.staged else nb
        tiles = triton.cdiv(nb, ROWS)
        self.nprog = min(tiles, max(triton.cdiv(self.cap, ROWS), MIN_PROGRAMS))
        self.nprog = self.nprog if self.staged else tiles
        self.small = torch.zeros(_STATE + 2 * 4 * 256, dtype=torch.int32, device=dev)
        self.state, hist = self.small[:_STATE], self.small[_STATE:]
        self.hist = (hist[:1024], hist[1024:])
        self.counts = torch.empty(
            2 * max(tiles, triton.cdiv(nb, TILE)), dtype=torch.int32, device=dev
        )
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
        of the error-feedback sum ``a`` (see ``gradsift._triton_keys``), writing nothing
        but this object's buffers. ``x`` and the states: flat, contiguous, one dtype."""
        self._prepare(x, k, out)
        mode = 0 if residual is None else 2 if velocity is not None else 1
        src = (x, residual, velocity, float(momentum))
        self.small.zero_()
        flags = dict(MODE=mode, ABSOLUTE=bool(absolute), BITS=self.bits)
        if self.staged:
            grid = (triton.cdiv(self.nblocks, ROWS),)
            block_keys_kernel[grid](
                *src, self.keys, self.state, x.numel(), self.nblocks, **flags,
                enable_fp_fusion=False,
            )  # fmt: skip
            self._stage(0, src, k, triton.cdiv(self.nblocks, TILE), flags, 0, (self.cand, None))
        outs = (self.mask, None) if out == "mask" else (self.indices, self.values)
        self._stage(1, src, k, self.nprog, flags, 2 if out == "mask" else 1, outs)

    def _stage(self, stage, src, k, nprog, flags, out, outs):
        all_ = not self.staged
        args = (*src, self.keys, self.cand, self.state, self.hist[stage], self.counts, *outs)
        sizes = (src[0].numel(), self.nblocks, self.cap, k, nprog)
        passes = self.bits // 8
        for phase, p in [(0, p) for p in range(passes)] + [(1, passes), (2, passes)]:
            if phase == 2:
                scan_kernel[(1,)](self.counts, self.state, self.nblocks, self.cap, stage, all_)
            stage_kernel[(nprog,)](
                *args, *sizes, STAGE=stage, ALL=all_, PHASE=phase, P=p, OUT=out,
                FLAGS=all_ and stage == 1 and phase == 0 and p == 0, **flags,
                enable_fp_fusion=False,
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
