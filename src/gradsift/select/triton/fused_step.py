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
first step, so the step can be captured in a CUDA graph (with a constant learning
rate, as for ``torch.optim.SGD`` with a float ``lr``).

References: Stich et al., "Sparsified SGD with Memory" (NeurIPS 2018,
arXiv:1809.07599); Lin et al., "Deep Gradient Compression" (ICLR 2018,
arXiv:1712.01887), Sec. 3.2.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from gradsift.checks import check_finite_grads
from gradsift.select.dispatch import DTYPES
from gradsift.select.triton.keys import _FLAG, _TILE, FLAG, TILE, load_source, rounded
from gradsift.select.triton.topk import Selection

__all__ = ["TritonStep", "triton_step_"]

SCATTER = 1024  # selected coordinates per program of the scatter kernel
_SCATTER = tl.constexpr(SCATTER)


@triton.jit
def write_kernel(x_ptr, r_ptr, u_ptr, m, state_ptr, n, MODE: tl.constexpr):
    """``r <- a``, ``u <- u'``, ``g <- 0`` everywhere, unless the flag is raised."""
    idx = tl.program_id(0) * _TILE + tl.arange(0, _TILE)
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
    MODE: tl.constexpr, APPLY: tl.constexpr, SEARCH: tl.constexpr,
):  # fmt: skip
    """On the selected coordinates: ``g = a``, ``r = u = 0`` and, with APPLY,
    ``p -= lr * a`` in the parameter found by binary search of the bucket's offsets."""
    j = tl.program_id(0) * _SCATTER + tl.arange(0, _SCATTER)
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


class TritonStep:
    """One bucket's fused step: its ``Selection`` buffers and the parameter table
    (data pointers, offsets, learning rates; rebuilt only when they change)."""

    def __init__(self, bucket) -> None:
        self.bucket = bucket
        self.selection = Selection()
        self._table_key = None
        self._table = (None, None, None)

    def _parameter_table(self, lrs: list[float]):
        params, dev = self.bucket.params, self.bucket.grad.device
        key = (tuple(p.data_ptr() for p in params), tuple(lrs))
        if key != self._table_key:
            search = max(1, math.ceil(math.log2(len(params))))
            pad = (1 << search) + 1 - len(params)
            offsets = self.bucket.offsets + [self.bucket.grad.numel()] * pad
            host = (
                torch.tensor(key[0], dtype=torch.int64),
                torch.tensor(offsets, dtype=torch.int64),
                torch.tensor(lrs, dtype=torch.float32),
            )
            # pinned + non_blocking: the copy does not wait for the device
            pinned = dev.type == "cuda"
            self._table = tuple(
                t.pin_memory().to(dev, non_blocking=True) if pinned else t for t in host
            )
            self._table_key, self._search = key, search
        return self._table

    @torch.no_grad()
    def step_(self, k, *, residual, velocity, momentum, lrs=None):
        """Select, update the state and (``lrs``: one per parameter) apply plain SGD."""
        g, sel = self.bucket.grad, self.selection
        sel.run(g, k, residual=residual, velocity=velocity, momentum=momentum)
        mode = 0 if residual is None else 2 if velocity is not None else 1
        src = (g, residual, velocity, float(momentum), sel.state)
        write_kernel[(triton.cdiv(g.numel(), TILE),)](
            *src, g.numel(), MODE=mode, enable_fp_fusion=False
        )
        table = self._parameter_table(lrs) if lrs is not None else (None, None, None)
        scatter_kernel[(triton.cdiv(k, SCATTER),)](
            sel.indices, sel.values, *src[:3], sel.state, k, *table, MODE=mode,
            APPLY=lrs is not None, SEARCH=self._search if lrs is not None else 0,
            enable_fp_fusion=False,
        )  # fmt: skip
        return sel.indices, sel.values

    @property
    def found_nonfinite(self) -> torch.Tensor:
        """A 0-dim bool device tensor: whether the last step was skipped."""
        return self.selection.state[FLAG] != 0


def _fused_bucket(opt):
    """``(bucket, k)`` for the fused step, or None where it does not apply: several
    buckets, ``scope="layer"``, a gradient missing or outside the buckets, float64,
    or every coordinate kept (the inner optimizer's dense step then runs)."""
    grads = opt._grads
    if grads.stale() or len(grads.buckets) != 1 or opt.scope != "global":
        return None
    b = grads.buckets[0]
    outside = any(p.grad is not None and id(p) not in grads.ids for p in opt._params())
    if outside or b.grad.dtype not in DTYPES or not all(b.present(grads.tracker.touched)):
        return None
    k = opt.budget.resolve(b.grad.numel())
    if k >= b.grad.numel() or not b.attach_grads_():
        return None
    return b, k


def triton_step_(opt) -> bool:
    """``TopK.step`` for ``backend="triton"``: False (nothing done) where the fused
    path does not apply (``_fused_bucket``), and the caller runs the torch path."""
    opt.found_nonfinite = None
    fused = _fused_bucket(opt)
    if fused is None:
        return False
    b, k = fused
    if getattr(opt, "_triton_step", None) is None or opt._triton_step.bucket is not b:
        opt._triton_step = TritonStep(b)
    lrs = opt._sparse_sgd_lrs()
    opt._triton_step.step_(
        k,
        residual=b.state.get("residual"),
        velocity=b.state.get("momentum"),
        momentum=opt.momentum_correction or 0.0,
        lrs=lrs,
    )
    opt.found_nonfinite = opt._triton_step.found_nonfinite
    if lrs is None:
        if bool(opt.found_nonfinite):  # the one host sync of this case
            check_finite_grads(b.params, [b.grad], opt._name)
            raise ValueError("the error-feedback sum holds NaN; nothing was modified")
        opt.optimizer.step()
    return True
