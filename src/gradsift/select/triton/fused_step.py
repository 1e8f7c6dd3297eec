"""The fused ``TopK`` + error-feedback step as Triton kernels, with no host sync (private).

The maths is ``gradsift.optim.error_feedback``'s, on the flat gradient ``g``, residual ``r`` and
(DGC) velocity ``u`` of one bucket::

    u' = m u + g;  a = r + u' (or r + g, or g)      computed on the fly, not stored
    S  = top_k(|a|)                                  gradsift.select.triton.topk.Selection
    r <- a, u <- u', g <- 0;  then on S: g = a, r = 0, u = 0   (write + scatter kernels)
    p -= lr * a on S                                 plain SGD, fused into the scatter

The results equal the torch path's bit for bit: the same selection, the same
roundings (see ``gradsift.select.triton.keys``), and the sparse SGD update rounded as
``Tensor.index_add_(alpha=-lr)`` rounds it (``alpha`` and the product in the dtype).

**Non-finite gradients** are found on the device, the way ``GradScaler`` finds
``found_inf``: the selection ORs a flag when ``g`` holds inf/NaN or ``a`` holds NaN,
and the write and scatter kernels then change nothing (parameters, residual, velocity
and gradient stay as they were). ``TopK.found_nonfinite`` is that flag as a device
tensor, to be read whenever convenient; reading it is the only host sync. With an
inner optimizer other than plain SGD the flag must be read before that optimizer
steps, so that case costs one sync and raises ``ValueError`` as the torch path does.

Launch shapes are fixed by ``(N, k, dtype)`` and no buffer is allocated after the
first step, so the step can be captured in a CUDA graph. The learning rates lie in a
device tensor that the scatter kernel reads when it runs: a scheduler's new rate is
copied into it, and the captured step stays valid.

References: Stich et al., "Sparsified SGD with Memory" (NeurIPS 2018,
arXiv:1809.07599); Lin et al., "Deep Gradient Compression" (ICLR 2018,
arXiv:1712.01887), Sec. 3.2.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from gradsift.select.triton.keys import (
    _FLAG,
    _TILE,
    FLAG,
    TILE,
    load_source,
    rounded,
    source_mode,
)
from gradsift.select.triton.replay import Replay
from gradsift.select.triton.topk import Selection

__all__ = ["FusedStep"]

SCATTER = 1024  # selected coordinates per program of the scatter kernel
_SCATTER = tl.constexpr(SCATTER)


@triton.jit
def write_kernel(x_ptr, r_ptr, u_ptr, m, state_ptr, n, MODE: tl.constexpr, WIDE: tl.constexpr):
    """``r <- a``, ``u <- u'``, ``g <- 0`` everywhere, unless the flag is raised.
    ``WIDE``: 64-bit positions (past 2**31 elements the 32-bit ones wrap negative)."""
    t = tl.program_id(0)
    idx = (t.to(tl.int64) * _TILE if WIDE else t * _TILE) + tl.arange(0, _TILE)
    mask = idx < tl.where(tl.load(state_ptr + _FLAG) == 0, n, 0)
    a, added, g = load_source(x_ptr, r_ptr, u_ptr, m, idx, mask, MODE)
    if MODE != 0:
        tl.store(r_ptr + idx, a, mask=mask)
    if MODE == 2:
        tl.store(u_ptr + idx, added, mask=mask)
    tl.store(x_ptr + idx, tl.zeros_like(g), mask=mask)


@triton.jit
def scatter_kernel(
    idx_ptr, val_ptr, x_ptr, r_ptr, u_ptr, state_ptr, k, ptrs_ptr, offsets_ptr, lrs_ptr,
    MODE: tl.constexpr, APPLY: tl.constexpr, SEARCH: tl.constexpr, WIDE: tl.constexpr,
):  # fmt: skip
    """On the selected coordinates: ``g = a``, ``r = u = 0`` and, with APPLY,
    ``p -= lr * a`` in the parameter found by binary search of the bucket's offsets."""
    t = tl.program_id(0)
    j = (t.to(tl.int64) * _SCATTER if WIDE else t * _SCATTER) + tl.arange(0, _SCATTER)
    mask = j < tl.where(tl.load(state_ptr + _FLAG) == 0, k, 0)
    i = tl.load(idx_ptr + j, mask=mask, other=0)
    v = tl.load(val_ptr + j, mask=mask, other=0.0)
    tl.store(x_ptr + i, v, mask=mask)
    if MODE != 0:
        tl.store(r_ptr + i, tl.zeros_like(v), mask=mask)
    if MODE == 2:
        tl.store(u_ptr + i, tl.zeros_like(v), mask=mask)
    if APPLY:
        lo = tl.zeros_like(j)
        hi = lo + (1 << SEARCH)
        for _ in tl.static_range(SEARCH):  # offsets are padded with N to 2**SEARCH + 1
            mid = (lo + hi) // 2
            right = tl.load(offsets_ptr + mid, mask=mask, other=0) <= i
            lo = tl.where(right, mid, lo)
            hi = tl.where(right, hi, mid)
        base = tl.load(ptrs_ptr + lo, mask=mask, other=0)
        p_ptr = base.to(tl.pointer_type(v.dtype), bitcast=True) + (i - tl.load(offsets_ptr + lo))
        alpha = rounded(-tl.load(lrs_ptr + lo, mask=mask, other=0.0), v.dtype)
        step = rounded(v.to(tl.float32) * alpha.to(tl.float32), v.dtype)
        p = tl.load(p_ptr, mask=mask, other=0.0)
        tl.store(p_ptr, rounded(p.to(tl.float32) + step.to(tl.float32), v.dtype), mask=mask)


def _pinned(host: torch.Tensor, dev: torch.device) -> torch.Tensor:
    """``host`` in pinned memory where it is bound for a GPU: copied from there with
    ``non_blocking=True``, the copy does not wait for the device."""
    return host.pin_memory() if dev.type == "cuda" else host


class FusedStep:
    """The fused step of one flat gradient, as a function of tensors: its
    ``Selection`` buffers, the parameter table of the SGD apply (rebuilt only when the
    parameters or learning rates change) and the launches replayed as a CUDA graph."""

    def __init__(self) -> None:
        self.selection = Selection()
        self.replay = Replay()
        self._table_key = None
        self._table = (None, None, None)
        self._search = 0
        self._lrs = None

    def _parameter_table(self, params, offsets: list[int], lrs: list[float], n: int, dev):
        """``(pointers, offsets, lrs)`` on ``dev``, keyed by the layout only: a new
        learning rate (a scheduler's, every step) is copied into the same ``lrs``
        tensor, which the kernel reads at run time, so a captured step stays valid."""
        key = (tuple(p.data_ptr() for p in params), tuple(offsets))
        if key != self._table_key:
            search = max(1, math.ceil(math.log2(len(params))))
            padded = list(offsets) + [n] * ((1 << search) + 1 - len(params))
            host = (
                torch.tensor(key[0], dtype=torch.int64, device="cpu"),
                torch.tensor(padded, dtype=torch.int64, device="cpu"),
                torch.tensor(lrs, dtype=torch.float32, device="cpu"),
            )
            cuda = dev.type == "cuda"  # on the CPU, .to(dev) returns the host tensor
            self._table = tuple(_pinned(t, dev).to(dev, non_blocking=cuda) for t in host)
            self._table_key, self._search, self._lrs = key, search, tuple(lrs)
        elif tuple(lrs) != self._lrs:
            lr_host = torch.tensor(lrs, dtype=torch.float32, device="cpu")
            self._table[2].copy_(_pinned(lr_host, dev), non_blocking=dev.type == "cuda")
            self._lrs = tuple(lrs)
        return self._table

    @torch.no_grad()
    def step_(self, grad, k, *, residual=None, velocity=None, momentum=0.0, params=None,
              offsets=None, lrs=None):  # fmt: skip
        """Select on ``a`` (see the module docstring), update ``residual``/``velocity``,
        leave ``a`` on the selected coordinates of ``grad`` (0 elsewhere) and, with
        ``lrs`` (one per tensor of ``params``, which start at ``offsets`` of ``grad``),
        apply plain SGD to them. Returns the selected ``(indices, values)``."""
        sel, n = self.selection, grad.numel()
        mode = source_mode(residual, velocity)
        src = (grad, residual, velocity, float(momentum))
        table = (None, None, None)
        if lrs is not None:
            table = self._parameter_table(params, offsets, lrs, n, grad.device)
        sel.prepare(grad, k, "indices")

        def launch():
            sel.run(grad, k, residual=residual, velocity=velocity, momentum=momentum)
            write_kernel[(triton.cdiv(n, TILE),)](
                *src, sel.state, n, MODE=mode, WIDE=sel.wide, enable_fp_fusion=False
            )
            scatter_kernel[(triton.cdiv(k, SCATTER),)](
                sel.indices, sel.values, *src[:3], sel.state, k, *table, MODE=mode,
                APPLY=lrs is not None, SEARCH=self._search if lrs is not None else 0,
                WIDE=sel.wide, enable_fp_fusion=False,
            )  # fmt: skip

        states = tuple(t.data_ptr() if t is not None else 0 for t in (grad, residual, velocity))
        # the table's key only when the SGD apply is launched: a step without it must
        # never replay a graph captured with it
        applied = self._table_key if lrs is not None else None
        self.replay((states, n, grad.dtype, k, float(momentum), applied), grad.device, launch)
        return sel.indices, sel.values

    @property
    def found_nonfinite(self) -> torch.Tensor:
        """A 0-dim bool device tensor: whether the last step was skipped."""
        return self.selection.state[FLAG] != 0
