"""Exact global top-k as Triton kernels, with no host synchronisation.

The same selection as ``gradsift.select`` (the k largest keys, ascending indices, the
lowest-index ties at the cut) in three stages, all decided on the device:

0. **Block filter** (when ``4 k <= N / BLOCK``, ``BLOCK`` = 32, or 8 for larger k):
   one pass reads every element, writes the largest key of each block of ``BLOCK``
   and ORs NaN into a flag. Two radix passes over the block keys give ``t``, the
   k-th largest block key with its low 16 bits cleared (exact for 16-bit keys). At
   least ``k`` blocks reach ``t``, so at least ``k`` elements do, so the k-th largest
   element is ``>= t``: every element of the top k, and every one tied with the k-th,
   lies in a block whose key is ``>= t``. Those blocks are compacted, in order, into
   a buffer of ``2 k + SLACK`` blocks.
1. **Element list**: the elements ``>= t`` of those blocks, with their indices,
   compacted in order into a list of ``3 k + LIST_SLACK``.
2. **Exact stage** over the listed elements: radix select of the k-th largest key
   ``v``, then ordered compaction of ``key > v`` and the first ``need`` keys ``== v``
   (``gradsift.select.triton.radix``). If a buffer before it overflows (many blocks
   tied at ``t``, as with mostly-zero gradients) the stage after it reads every
   element instead: the dense fallback is decided on the device and costs speed,
   never exactness. Unstaged selections (larger k, masks) run stage 2 alone.

Every kernel runs a fixed grid of programs, each owning a contiguous range of tiles,
so launch shapes depend only on ``(N, k, dtype)`` and the kernels can be captured in
a CUDA graph. The pass, the phase and the order (``absolute``) are run-time
arguments: per dtype and block size four kernels are compiled (block keys and one
per stage), which ``warmup`` can do ahead of the first call. Indices are 64-bit past 2**31
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
from collections import OrderedDict

import torch
import triton

from gradsift.select.exact import raise_nan
from gradsift.select.triton.keys import (
    FLAG,
    NAN_KEY,
    TILE,
    block_keys_kernel,
    source_mode,
)
from gradsift.select.triton.replay import Replay
from gradsift.select.triton.stages import MAX_PROGRAMS, STAGE0_PASSES, stage_kernel

__all__ = ["Selection", "topk_indices", "topk_mask", "warmup"]

SLACK = 1024  # candidate blocks beyond 2k: room for ties among block keys
LIST_SLACK = 4096  # listed elements beyond 3k
PROGRAMS_PER_SM = 8  # resident programs per multiprocessor for the streaming passes
_STATE = 8  # int64 slots: flags, then (above, ties) totals of each stage
# from this many elements on, positions are 64-bit (a 32-bit tile start would wrap);
# the tests lower it to run the 64-bit kernels on small inputs
WIDE_FROM = 2**31 - TILE


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

    def prepare(self, x: torch.Tensor, k: int, out: str) -> None:
        """Allocate the buffers for this shape (nothing when it is the last one's)."""
        shape = (x.numel(), k, x.dtype, x.device, out)
        if shape == self._shape:
            return
        n, dev = x.numel(), x.device
        self.bits = 16 if x.element_size() == 2 else 32
        self.wide = n >= WIDE_FROM
        self.block = 32
        if out != "mask" and 4 * k > n // 32:
            self.block = 8  # larger k: finer blocks keep the candidates few
        self.nblocks = nb = triton.cdiv(n, self.block)
        self.staged = out != "mask" and 4 * k <= nb
        self.cap = min(nb, 2 * k + SLACK) if self.staged else nb
        self.ecap = min(n, 3 * k + LIST_SLACK) if self.staged else 0
        self.nprog = self._grids(n, dev)
        self.small = torch.zeros(_STATE + 2 * 4 * 256, dtype=torch.int64, device=dev)
        self.state, hist = self.small[:_STATE], self.small[_STATE:]
        self.hist = (hist[:1024], hist[1024:])
        self.counts = torch.empty(2 * MAX_PROGRAMS, dtype=torch.int64, device=dev)
        self.keys = torch.empty(nb if self.staged else 0, dtype=torch.int32, device=dev)
        # candidate block indices: past 2**31 blocks (2**34 elements) int32 would wrap
        cand = torch.int64 if self.wide else torch.int32
        self.cand = torch.empty(self.cap if self.staged else 0, dtype=cand, device=dev)
        self.list_idx = torch.empty(self.ecap, dtype=torch.int64, device=dev)
        self.list_val = torch.empty(self.ecap, dtype=x.dtype, device=dev)
        if out == "mask":
            self.mask = torch.empty(n, dtype=torch.uint8, device=dev)
        else:
            self.indices = torch.empty(k, dtype=torch.int64, device=dev)
            self.values = torch.empty(k, dtype=x.dtype, device=dev)
        self._shape = shape

    def _grids(self, n: int, dev) -> tuple[int, int, int]:
        """Programs of each stage: as many as its tiles when its buffers hold (no
        program idles through a launch), at least one per multiprocessor for the
        dense fallback, at most ``_programs``."""
        most = _programs(dev)
        floor = max(1, most // PROGRAMS_PER_SM)
        if not self.staged:
            return (1, 1, min(most, max(1, triton.cdiv(n, TILE))))
        return (
            min(most, triton.cdiv(self.nblocks, TILE)),
            min(most, max(floor, triton.cdiv(self.cap * self.block, TILE))),
            min(most, max(floor, triton.cdiv(self.ecap, TILE))),
        )

    def run(
        self, x, k, *, absolute=True, residual=None, velocity=None, momentum=0.0, out="indices"
    ):
        """Select the top ``k`` of ``x`` (``absolute``: of ``|x|``), or with ``residual``
        of the error-feedback sum ``a`` (see ``gradsift.select.triton.keys``), writing
        nothing but this object's buffers. ``x`` and the states: flat, contiguous, one
        dtype."""
        self.prepare(x, k, out)
        mode = source_mode(residual, velocity)
        src = (x, residual, velocity, float(momentum))
        self.small.zero_()
        consts = dict(MODE=mode, BITS=self.bits, BLOCK=self.block, WIDE=self.wide)
        n, absolute = x.numel(), int(bool(absolute))
        outs = (self.mask, None) if out == "mask" else (self.indices, self.values)
        if self.staged:
            rows = TILE // self.block
            block_keys_kernel[(triton.cdiv(self.nblocks, rows),)](
                *src, self.keys, self.state, n, self.nblocks, absolute, **consts,
                enable_fp_fusion=False,
            )  # fmt: skip
            self._stage(0, src, k, absolute, range(STAGE0_PASSES), outs, consts)
            self._stage(1, src, k, absolute, (), outs, consts)
        passes = range(self.bits // 8)
        self._stage(2, src, k, absolute, passes, outs, consts, 2 if out == "mask" else 1)

    def _stage(self, stage, src, k, absolute, passes, outs, consts, out_kind=1):
        hist = self.hist[stage // 2]
        lists = (self.list_idx, self.list_val)
        args = (*src, self.keys, self.cand, *lists, self.state, hist, self.counts, *outs)
        nprog = self.nprog[stage]
        sizes = (src[0].numel(), self.nblocks, self.cap, self.ecap, k, nprog)
        all_ = int(not self.staged)
        for phase, p in [(0, p) for p in passes] + [(1, len(passes)), (2, len(passes))]:
            stage_kernel[(nprog,)](
                *args, *sizes, phase, p, absolute, all_, STAGE=stage, OUT=out_kind,
                **consts, enable_fp_fusion=False,
            )  # fmt: skip

    def found_nan(self) -> bool:
        """Whether a NaN key was seen (one host sync)."""
        return bool(int(self.state[FLAG]) & NAN_KEY)


_CACHED = OrderedDict()  # (input, k, order, output) -> (Selection, Replay), latest last
MAX_CACHED = 4  # selections whose buffers (about N / 6 bytes each) are kept


def _selected(x: torch.Tensor, k: int, absolute: bool, out: str) -> Selection:
    """Run the selection of ``x``, reusing the buffers and the captured launches of
    the last calls with the same input (address, size, dtype), ``k`` and order."""
    key = (x.data_ptr(), x.numel(), x.dtype, x.device, k, bool(absolute), out)
    if key in _CACHED:
        _CACHED.move_to_end(key)
    else:
        _CACHED[key] = (Selection(), Replay())
        if len(_CACHED) > MAX_CACHED:
            _CACHED.popitem(last=False)
    sel, replay = _CACHED[key]
    sel.prepare(x, k, out)
    replay(key, x.device, lambda: sel.run(x, k, absolute=absolute, out=out))
    if sel.found_nan():
        raise_nan(x)
    return sel


def topk_indices(x: torch.Tensor, k: int, absolute: bool) -> torch.Tensor:
    """``gradsift.topk_indices`` on the Triton kernels (arguments already checked)."""
    return _selected(x, k, absolute, "indices").indices.clone()


def topk_mask(x: torch.Tensor, k: int, absolute: bool) -> torch.Tensor:
    """``gradsift.topk_mask`` on the Triton kernels (arguments already checked)."""
    return _selected(x, k, absolute, "mask").mask.clone().view(torch.bool)


def warmup(device="cuda", dtypes=(torch.float16, torch.bfloat16, torch.float32)) -> None:
    """Compile the selection kernels for ``dtypes`` on ``device`` ahead of the first
    real call (each dtype: block keys and the three stages, for both block sizes), so
    that a training loop's first step does not stall on compilation."""
    n = 8 * TILE
    for dtype in dtypes:
        x = torch.randn(n, device=device).to(dtype)
        # k = 1: 32-element blocks; 4k in (N / 32, N / 8]: 8-element blocks
        for k in (1, n // 64):
            topk_indices(x, k, True)
